//! Striped directories over three MDTs: one directory whose names are spread over shards on
//! every MDT by a hash of each name, made, used, listed and removed through the library as
//! any directory, with the servers deciding where each name may live.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError};
use oss::engine::mem::MemEngine;
use proto::dirstripe::{DirStripe, HashType, ShardOf, StripeState};
use proto::fid::mdt_of;
use proto::md::*;
use proto::{FsErrorKind, StatusCode};

const T: Duration = Duration::from_secs(10);

/// MDT0..MDT2 on three MDSs and two storage servers on loopback, and a root client of MDT0
/// once every target takes stripes on every MDT.
async fn three_mdts(
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
        .mdts(3);
    let c = tweak(b).start().await.unwrap();
    let admin = root_client(&c, "admin").await;
    c.wait_ready(&admin, 2, Duration::from_secs(20))
        .await
        .unwrap();
    // Every MDT takes stripes: a file made in a directory on each.
    for k in 1..3 {
        let d = format!("/warm{k}");
        admin.mkdir_on(&d, 0o755, k).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match write(&admin, &format!("{d}/f"), b"x").await {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    let _ = e; // MDT{k} not ready yet
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("MDT{k} never took a file: {e}"),
            }
        }
    }
    (dir, c, admin)
}

async fn root_client(c: &Cluster, name: &str) -> Client {
    c.client(
        name,
        ClientConfig {
            creds: Creds::root(),
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap()
}

async fn write(c: &Client, path: &str, bytes: &[u8]) -> client::Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .open(c, path)
        .await?;
    f.write_at(0, bytes).await?;
    f.fsync().await?;
    f.close().await
}

async fn read(c: &Client, path: &str) -> Vec<u8> {
    let f = OpenOptions::new().read(true).open(c, path).await.unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let n = f.read_at(0, &mut buf).await.unwrap();
    buf.truncate(n);
    f.close().await.unwrap();
    buf
}

fn names(l: Vec<DirEntry>) -> Vec<String> {
    l.into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect()
}

/// A client of `c` acting as an unprivileged user (uid and gid 1000).
async fn user_client(c: &Cluster) -> Client {
    let cfg = ClientConfig {
        creds: Creds {
            uid: 1000,
            gid: 1000,
            groups: vec![],
        },
        ..ClientConfig::default()
    };
    c.client("user", cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_directory_spreads_its_names_over_every_mdt_and_is_used_and_removed_as_one() {
    let (dir, c, admin) = three_mdts("lode-dirstripe", |b| b).await;
    let made = admin
        .mkdir_striped("/s", 0o755, 3, Some(1), HashType::Fnv1a64)
        .await
        .unwrap();
    assert_eq!(mdt_of(made.fid), Some(0), "the master lives with its name");
    let stripe: DirStripe = admin.dir_stripe(made.fid).await.unwrap().unwrap();
    assert_eq!(
        (stripe.count, stripe.offset, stripe.state),
        (3, 1, StripeState::Ready)
    );
    let shard_mdts: Vec<u32> = stripe.shards.iter().map(|f| mdt_of(*f).unwrap()).collect();
    assert_eq!(shard_mdts, vec![1, 2, 0], "shard j on MDT (offset + j) % 3");

    // Files made in it live on the MDT of the shard their name hashes to.
    let mut per_mdt: HashMap<u32, usize> = HashMap::new();
    let mut made_names = BTreeSet::new();
    for i in 0..120 {
        let name = format!("f{i}");
        let path = format!("/s/{name}");
        write(&admin, &path, format!("{i}").as_bytes())
            .await
            .unwrap();
        let f = admin.stat(&path).await.unwrap();
        let shard = stripe.shard_for(name.as_bytes()).unwrap();
        assert_eq!(mdt_of(f.fid), mdt_of(shard), "{name}");
        *per_mdt.entry(mdt_of(f.fid).unwrap()).or_default() += 1;
        made_names.insert(name);
    }
    assert_eq!(per_mdt.len(), 3, "{per_mdt:?}");
    assert!(per_mdt.values().all(|n| *n >= 20), "{per_mdt:?}");
    let sub = admin.mkdir("/s/sub", 0o700).await.unwrap();
    assert_eq!(mdt_of(sub.fid), mdt_of(stripe.shard_for(b"sub").unwrap()));
    write(&admin, "/s/sub/deep", b"deep").await.unwrap();
    made_names.insert("sub".into());

    // Listed whole, each name once; read back, from this client and from one that never
    // saw the layout (told by the MDS, it reads it and goes again).
    let listed = names(admin.readdir("/s").await.unwrap());
    assert_eq!(listed.len(), made_names.len());
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), made_names);
    let other = root_client(&c, "other").await;
    assert_eq!(read(&other, "/s/f7").await, b"7");
    assert_eq!(read(&other, "/s/sub/deep").await, b"deep");
    let plus = other.readdir_plus(made.fid).await.unwrap();
    assert_eq!(plus.len(), made_names.len());
    let fresh = root_client(&c, "fresh").await;
    let listed = names(fresh.readdir_fid(made.fid).await.unwrap());
    assert_eq!(listed.len(), made_names.len());
    let e = admin.stat("/s/absent").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotFound), "{e}");

    // Renames within a shard's MDT work, and across two MDTs too (the name moves, the file
    // stays on its MDT), as a checkpoint's write-then-rename needs.
    let (a, b) = (0..200)
        .map(|i| format!("r{i}"))
        .fold((None, None), |(a, b), n| {
            let k = mdt_of(stripe.shard_for(n.as_bytes()).unwrap());
            let f7 = mdt_of(stripe.shard_for(b"f7").unwrap());
            match (k == f7, a, b) {
                (true, None, b) => (Some(n), b),
                (false, a, None) => (a, Some(n)),
                (_, a, b) => (a, b),
            }
        });
    let (same, across) = (a.unwrap(), b.unwrap());
    admin.rename("/s/f7", &format!("/s/{same}")).await.unwrap();
    assert_eq!(read(&other, &format!("/s/{same}")).await, b"7");
    admin
        .rename(&format!("/s/{same}"), &format!("/s/{across}"))
        .await
        .unwrap();
    assert_eq!(read(&other, &format!("/s/{across}")).await, b"7");
    let e = admin.stat(&format!("/s/{same}")).await.unwrap_err();
    assert!(e.is(FsErrorKind::NotFound), "{e}");
    made_names.remove("f7");
    made_names.insert(across.clone());
    let listed = names(fresh.readdir_fid(made.fid).await.unwrap());
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), made_names);

    // A chmod of the directory reaches every shard (their MDSs decide by them).
    admin
        .setattr(
            "/s",
            SetAttr {
                mode: Some(0o750),
                ..SetAttr::default()
            },
        )
        .await
        .unwrap();
    for shard in &stripe.shards {
        let s = admin.getattr(*shard).await.unwrap();
        assert_eq!(s.mode & 0o7777, 0o750, "{shard}");
    }

    // As an attacker with the client key: the servers' halves are refused, and a name in
    // the master or in a shard its hash does not give is refused (no name in two shards).
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let mdt = |k: u32| c.mdt(k).unwrap().nid();
    let forged = [
        Mutation::MakeShard {
            shard: ShardOf {
                master: made.fid,
                index: 0,
                count: 3,
                hash: 2,
                frozen: false,
            },
            mode: 0o777,
            uid: 0,
            gid: 0,
            layout: None,
        },
        Mutation::SetDirStripe {
            fid: made.fid,
            stripe: DirStripe {
                shards: vec![],
                state: StripeState::Emptied,
                ..stripe.clone()
            },
        },
        Mutation::FreezeShard {
            fid: stripe.shards[0],
            frozen: true,
        },
        Mutation::RmdirShard {
            fid: stripe.shards[0],
        },
    ];
    for m in forged {
        let to = home(&m).map_or_else(|| c.mds().nid(), &mdt);
        let r = MdsReint::durable(Creds::root(), m);
        match call(&raw, &to, &r, T).await {
            Err(NetError::Remote { err, .. }) => assert_eq!(
                err.code,
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "{err:?}"
            ),
            other => panic!("a client's server-only change of a striped directory: {other:?}"),
        }
    }
    let create = |parent, name: &str| {
        MdsReint::durable(
            Creds::root(),
            Mutation::Create {
                parent,
                name: name.as_bytes().to_vec(),
                kind: Kind::File,
                mode: 0o644,
                exclusive: true,
                target: vec![],
                layout: None,
            },
        )
    };
    let wrong = |e: Result<MdsReintReply, NetError>| match e {
        Err(NetError::Remote { err, .. }) => {
            assert_eq!(err.code, StatusCode::Fs(FsErrorKind::WrongShard), "{err:?}")
        }
        other => panic!("a name where it does not live: {other:?}"),
    };
    wrong(call(&raw, &c.mds().nid(), &create(made.fid, "in-master"), T).await);
    let name = "elsewhere";
    let right = stripe.shard_index(name.as_bytes()).unwrap() as usize;
    let bad = stripe.shards[(right + 1) % 3];
    wrong(call(&raw, &mdt(mdt_of(bad).unwrap()), &create(bad, name), T).await);

    // Not empty: ENOTEMPTY, every shard thawed (names can be made again), nothing lost.
    let e = admin.rmdir("/s").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotEmpty), "{e}");
    write(&admin, "/s/after", b"after").await.unwrap();
    assert_eq!(read(&other, "/s/after").await, b"after");
    assert_eq!(read(&other, "/s/f1").await, b"1");
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");

    // Emptied, it goes with its shards.
    for n in names(admin.readdir("/s").await.unwrap()) {
        if n == "sub" {
            admin.unlink("/s/sub/deep").await.unwrap();
            admin.rmdir("/s/sub").await.unwrap();
        } else {
            admin.unlink(&format!("/s/{n}")).await.unwrap();
        }
    }
    admin.rmdir("/s").await.unwrap();
    let e = admin.stat("/s").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotFound), "{e}");
    for shard in &stripe.shards {
        let e = admin.getattr(*shard).await.unwrap_err();
        assert!(e.is(FsErrorKind::Stale), "{shard}: {e}");
    }
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    // The name can be made again, as a plain directory.
    admin.mkdir("/s", 0o755).await.unwrap();
    write(&fresh, "/s/plain", b"p").await.unwrap();
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each MDT's own check, then all three against each other.
fn fsck_all(c: &Cluster) -> Vec<String> {
    let spaces: Vec<_> = (0..3).map(|k| c.mdt(k).unwrap().namespace()).collect();
    let mut problems: Vec<String> = (0..3).flat_map(|k| c.mdt(k).unwrap().fsck()).collect();
    let refs: Vec<_> = spaces.iter().collect();
    problems.extend(mds::across::check_across(&refs));
    problems
}

/// The MDT a server-only change goes to, for the attacker above.
fn home(m: &Mutation) -> Option<u32> {
    match m {
        Mutation::FreezeShard { fid, .. } | Mutation::RmdirShard { fid } => mdt_of(*fid),
        _ => None,
    }
}

/// kill -9 of a shard's MDS while a striped directory is made: the mkdir waits, the master's
/// MDS makes the shard once it is back, and the directory is whole; kill -9 of the master's
/// MDS after it loses nothing acknowledged in any shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_mkdir_waits_for_a_down_mdt_and_everything_survives_kill_9() {
    let (dir, mut c, admin) = three_mdts("lode-dirstripe-kill", |b| {
        b.open_recovery(Duration::from_millis(500), Duration::from_secs(120))
    })
    .await;
    c.kill_mdt(2).await;
    let waiting = {
        let admin = admin.clone();
        tokio::spawn(async move {
            admin
                .mkdir_striped("/k", 0o755, 3, None, HashType::Fnv1a64)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !waiting.is_finished(),
        "a striped mkdir answered with an MDT down"
    );
    c.start_mdt(2).await.unwrap();
    let made = waiting.await.unwrap().unwrap();
    let stripe = admin.dir_stripe(made.fid).await.unwrap().unwrap();
    assert_eq!(stripe.state, StripeState::Ready);
    assert_eq!(stripe.shards.len(), 3);
    let mut kept = vec![];
    for i in 0..30 {
        let path = format!("/k/g{i}");
        write(&admin, &path, path.as_bytes()).await.unwrap();
        kept.push(path);
    }
    c.kill_mds().await;
    c.start_mds().await.unwrap();
    let after = root_client(&c, "after").await;
    for p in &kept {
        assert_eq!(read(&after, p).await, p.as_bytes(), "{p}");
    }
    assert_eq!(names(after.readdir("/k").await.unwrap()).len(), kept.len());
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rename of a file between directories of two MDTs: the name moves, the file stays on its
/// MDT with its FID, data and link count; the name can move on, come back, be replaced and be
/// removed, and the file goes when its last name does. Directories stay EXDEV.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_renamed_to_another_mdt_keeps_its_inode_and_goes_with_its_last_name() {
    let (dir, c, admin) = three_mdts("lode-moves", |b| b).await;
    admin.mkdir("/a", 0o755).await.unwrap();
    admin.mkdir_on("/b", 0o755, 1).await.unwrap();
    admin.mkdir_on("/c", 0o755, 2).await.unwrap();
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    write(&admin, "/a/f", &bytes).await.unwrap();
    let f = admin.stat("/a/f").await.unwrap();
    admin.rename("/a/f", "/b/g").await.unwrap();
    let e = admin.stat("/a/f").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotFound), "{e}");
    let g = admin.stat("/b/g").await.unwrap();
    assert_eq!((g.fid, g.nlink, g.size), (f.fid, 1, f.size));
    let other = root_client(&c, "other").await;
    assert_eq!(read(&other, "/b/g").await.len(), 65536);
    assert_eq!(other.stat("/b/g").await.unwrap().size, bytes.len() as u64);
    // On within MDT1, then to MDT2, then home again.
    admin.rename("/b/g", "/b/h").await.unwrap();
    admin.rename("/b/h", "/c/i").await.unwrap();
    assert_eq!(admin.stat("/c/i").await.unwrap().fid, f.fid);
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    admin.rename("/c/i", "/a/back").await.unwrap();
    assert_eq!(admin.stat("/a/back").await.unwrap().fid, f.fid);
    let listed = |p: &'static str| {
        let admin = admin.clone();
        async move { names(admin.readdir(p).await.unwrap()) }
    };
    assert!(listed("/b").await.is_empty() && listed("/c").await.is_empty());

    // Over a file of the other MDT: replaced, and the replaced file's objects freed.
    write(&admin, "/b/victim", b"old").await.unwrap();
    let victim = admin.stat("/b/victim").await.unwrap();
    admin.rename("/a/back", "/b/victim").await.unwrap();
    assert_eq!(admin.stat("/b/victim").await.unwrap().fid, f.fid);
    let e = admin.getattr(victim.fid).await.unwrap_err();
    assert!(e.is(FsErrorKind::Stale), "{e}");
    // Over a name of another MDT's file: that file goes once its home hears of it.
    write(&admin, "/a/z", b"z").await.unwrap();
    let z = admin.stat("/a/z").await.unwrap();
    admin.rename("/a/z", "/c/z").await.unwrap();
    admin.rename("/b/victim", "/c/z").await.unwrap();
    assert_eq!(admin.stat("/c/z").await.unwrap().fid, f.fid);
    gone(&admin, z.fid).await;
    // Removed by its name on another MDT: the file goes at its home.
    admin.unlink("/c/z").await.unwrap();
    gone(&admin, f.fid).await;
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");

    // The rest as a rename is: RENAME_NOREPLACE, permissions.
    write(&admin, "/a/n", b"n").await.unwrap();
    write(&admin, "/b/n", b"taken").await.unwrap();
    let e = admin
        .rename_with(
            "/a/n",
            "/b/n",
            RenameFlags {
                noreplace: true,
                exchange: false,
            },
        )
        .await
        .unwrap_err();
    assert!(e.is(FsErrorKind::Exists), "{e}");
    assert_eq!(read(&admin, "/a/n").await, b"n");
    admin.mkdir_on("/b/locked", 0o755, 1).await.unwrap();
    let user = user_client(&c).await;
    admin.mkdir("/a/mine", 0o777).await.unwrap();
    write(&user, "/a/mine/u", b"u").await.unwrap();
    let e = user.rename("/a/mine/u", "/b/locked/u").await.unwrap_err();
    assert!(e.is(FsErrorKind::AccessDenied), "{e}");
    assert_eq!(read(&user, "/a/mine/u").await, b"u");
    // A checkpoint: written under a temporary name, renamed over the last one on another MDT,
    // opened again with O_CREAT (at its home).
    for round in 0..3u8 {
        write(&admin, "/a/ckpt.tmp", &[round; 1000]).await.unwrap();
        admin.rename("/a/ckpt.tmp", "/b/ckpt").await.unwrap();
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .open(&admin, "/b/ckpt")
            .await
            .unwrap();
        f.close().await.unwrap();
        assert_eq!(read(&other, "/b/ckpt").await, vec![round; 1000]);
    }

    // As an attacker with the client key: the steps are the servers' own.
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let n = admin.stat("/a/n").await.unwrap();
    for (to, m) in [
        (
            1,
            Mutation::LinkIn {
                parent: admin.stat("/b").await.unwrap().fid,
                name: b"stolen".to_vec(),
                inode: n.clone(),
                noreplace: false,
            },
        ),
        (0, Mutation::DropLink { fid: n.fid }),
        (
            0,
            Mutation::MoveDone {
                parent: admin.stat("/a").await.unwrap().fid,
                name: b"n".to_vec(),
            },
        ),
    ] {
        let r = MdsReint::durable(Creds::root(), m);
        match call(&raw, &c.mdt(to).unwrap().nid(), &r, T).await {
            Err(NetError::Remote { err, .. }) => assert_eq!(
                err.code,
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "{err:?}"
            ),
            other => panic!("a client's step of a move: {other:?}"),
        }
    }
    assert_eq!(read(&admin, "/a/n").await, b"n");
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory renamed between directories of different MDTs keeps its inode and its tree
/// wherever its own MDT is (the old name's, the new name's or a third), replaces only an empty
/// directory, and never moves below itself, however its ancestors are spread over the MDTs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_renamed_between_mdts_keeps_its_tree_and_never_moves_below_itself() {
    let (dir, c, admin) = three_mdts("lode-dirmoves", |b| b).await;
    admin.mkdir_on("/a", 0o755, 0).await.unwrap();
    admin.mkdir_on("/b", 0o755, 1).await.unwrap();
    admin.mkdir_on("/c", 0o755, 2).await.unwrap();
    let other = root_client(&c, "other").await;
    let cluster = &c;
    let moved = |from: &'static str, to: &'static str, file: &'static str| {
        let (admin, other) = (admin.clone(), other.clone());
        async move {
            let before = admin.stat(from).await.unwrap();
            admin.rename(from, to).await.unwrap();
            let e = admin.stat(from).await.unwrap_err();
            assert!(e.is(FsErrorKind::NotFound), "{from}: {e}");
            let after = other.stat(to).await.unwrap();
            assert_eq!(after.fid, before.fid, "{from} -> {to}");
            assert_eq!(read(&other, &format!("{to}/{file}")).await, file.as_bytes());
            write(&admin, &format!("{to}/new"), b"new").await.unwrap();
            admin.unlink(&format!("{to}/new")).await.unwrap();
            let problems = fsck_all(cluster);
            assert!(problems.is_empty(), "{from} -> {to}: {problems:?}");
            after.fid
        }
    };
    // Its own MDT the old name's (MDT0), then the new name's (home again), then a third's.
    admin.mkdir("/a/d", 0o755).await.unwrap();
    write(&admin, "/a/d/f", b"f").await.unwrap();
    let d = moved("/a/d", "/b/d", "f").await;
    assert_eq!(mdt_of(d), Some(0));
    assert!(names(admin.readdir("/b").await.unwrap()).contains(&"d".to_string()));
    assert!(!names(admin.readdir("/a").await.unwrap()).contains(&"d".to_string()));
    moved("/b/d", "/a/d2", "f").await;
    admin.mkdir_on("/a/e", 0o755, 2).await.unwrap();
    write(&admin, "/a/e/g", b"g").await.unwrap();
    let e2 = moved("/a/e", "/b/e", "g").await;
    assert_eq!(mdt_of(e2), Some(2));
    // A striped directory: its names stay in their shards, found through the new name.
    admin
        .mkdir_striped("/a/s", 0o755, 3, None, HashType::Fnv1a64)
        .await
        .unwrap();
    for i in 0..6 {
        write(&admin, &format!("/a/s/f{i}"), format!("f{i}").as_bytes())
            .await
            .unwrap();
    }
    admin.rename("/a/s", "/c/s").await.unwrap();
    for i in 0..6 {
        assert_eq!(
            read(&other, &format!("/c/s/f{i}")).await,
            format!("f{i}").as_bytes()
        );
    }
    assert_eq!(admin.readdir("/c/s").await.unwrap().len(), 6);
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    // Another MDT's directory between two directories of one MDT: its MDT learns its parent.
    admin.mkdir("/a/y", 0o755).await.unwrap();
    admin.mkdir_on("/a/x", 0o755, 1).await.unwrap();
    write(&admin, "/a/x/h", b"h").await.unwrap();
    moved("/a/x", "/a/y/x", "h").await;
    // nlink of each parent counts its subdirectories wherever they live.
    assert_eq!(admin.stat("/a").await.unwrap().nlink, 2 + 2); // d2, y
    assert_eq!(admin.stat("/b").await.unwrap().nlink, 2 + 1); // e
    assert_eq!(admin.stat("/c").await.unwrap().nlink, 2 + 1); // s

    // Over a name: an empty directory of the new name's MDT only.
    admin.mkdir("/b/empty", 0o755).await.unwrap();
    write(&admin, "/b/file", b"x").await.unwrap();
    admin.mkdir("/b/full", 0o755).await.unwrap();
    write(&admin, "/b/full/z", b"z").await.unwrap();
    for (to, kind) in [
        ("/b/file", FsErrorKind::NotDir),
        ("/b/full", FsErrorKind::NotEmpty),
    ] {
        let e = admin.rename("/a/d2", to).await.unwrap_err();
        assert!(e.is(kind), "{to}: {e}");
        assert_eq!(read(&admin, "/a/d2/f").await, b"f");
    }
    let empty = admin.stat("/b/empty").await.unwrap();
    admin.rename("/a/d2", "/b/empty").await.unwrap();
    assert_eq!(read(&admin, "/b/empty/f").await, b"f");
    let e = admin.getattr(empty.fid).await.unwrap_err();
    assert!(e.is(FsErrorKind::Stale), "{e}");
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");

    // Another parent changes a directory's `..`: its owner's (or root's) to do, even
    // between directories anyone may write, on one MDT or across two.
    admin.mkdir_on("/a/open", 0o777, 0).await.unwrap();
    admin.mkdir_on("/a/open2", 0o777, 0).await.unwrap();
    admin.mkdir_on("/b/open", 0o777, 1).await.unwrap();
    admin.mkdir("/a/open/roots", 0o755).await.unwrap();
    let user = user_client(&c).await;
    for to in ["/b/open/roots", "/a/open2/roots"] {
        let e = user.rename("/a/open/roots", to).await.unwrap_err();
        assert!(e.is(FsErrorKind::AccessDenied), "{to}: {e}");
    }
    user.mkdir("/a/open/mine", 0o755).await.unwrap();
    user.rename("/a/open/mine", "/a/open2/mine").await.unwrap();
    user.rename("/a/open2/mine", "/b/open/mine").await.unwrap();
    assert!(admin.stat("/a/open/roots").await.is_ok());
    // So for a directory of a third MDT, whose mode its own MDT decides (the stub's MDT asks
    // it): between two MDTs, and between two directories of one.
    admin.mkdir_on("/a/open/far", 0o755, 2).await.unwrap();
    for to in ["/b/open/far", "/a/open2/far"] {
        let e = user.rename("/a/open/far", to).await.unwrap_err();
        assert!(e.is(FsErrorKind::AccessDenied), "{to}: {e}");
    }
    assert!(admin.stat("/a/open/far").await.is_ok());
    user.mkdir_on("/a/open/far2", 0o755, 2).await.unwrap();
    user.rename("/a/open/far2", "/a/open2/far2").await.unwrap();
    user.rename("/a/open2/far2", "/b/open/far2").await.unwrap();
    assert_eq!(user.stat("/b/open/far2").await.unwrap().uid, 1000);

    // Never below itself: across MDTs directly ...
    let e = admin.rename("/b", "/b/e/sub").await.unwrap_err();
    assert!(e.is(FsErrorKind::Invalid), "{e}");
    // ... and between two directories of one MDT whose path down passes through another:
    // /a/y (MDT0) / x (MDT1) / z (MDT0).
    admin.mkdir_on("/a/y/x/z", 0o755, 0).await.unwrap();
    let e = admin.rename("/a/y", "/a/y/x/z/y").await.unwrap_err();
    assert!(e.is(FsErrorKind::Invalid), "{e}");
    // Two renames that would make a loop together, from two MDSs at once: one is refused.
    admin.mkdir_on("/b/p", 0o755, 1).await.unwrap();
    admin.mkdir_on("/c/q", 0o755, 2).await.unwrap();
    for round in 0..4 {
        let (p, q) = if round % 2 == 0 {
            ("/b/p", "/c/q")
        } else {
            ("/c/q", "/b/p")
        };
        let (p_in, q_in) = (format!("{p}/in"), format!("{q}/in"));
        let one = admin.rename(p, &q_in);
        let two = other.rename(q, &p_in);
        let (one, two) = tokio::join!(one, two);
        assert!(
            one.is_err() || two.is_err(),
            "round {round}: both renames of a loop were carried out"
        );
        let problems = fsck_all(&c);
        assert!(problems.is_empty(), "round {round}: {problems:?}");
        // Back as they were, whichever went.
        if one.is_ok() {
            admin.rename(&format!("{q}/in"), p).await.unwrap();
        }
        if two.is_ok() {
            admin.rename(&format!("{p}/in"), q).await.unwrap();
        }
    }
    // The lock is let go each time.
    assert_eq!(c.mdt(0).unwrap().namespace().rename_lock(), None);

    // As an attacker with the client key: a directory's new parent and the lock are the
    // servers' own.
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let y = admin.stat("/a/y").await.unwrap();
    for (to, m) in [
        (
            2,
            Mutation::Reparent {
                dir: e2,
                parent: y.fid,
            },
        ),
        (
            0,
            Mutation::RenameLock {
                holder: 1,
                key: Some(ReqId { client: 7, seq: 7 }),
            },
        ),
    ] {
        let r = MdsReint::durable(Creds::root(), m);
        match call(&raw, &c.mdt(to).unwrap().nid(), &r, T).await {
            Err(NetError::Remote { err, .. }) => assert_eq!(
                err.code,
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "{err:?}"
            ),
            other => panic!("a client's step of a directory's move: {other:?}"),
        }
    }
    assert_eq!(read(&admin, "/b/e/g").await, b"g");
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hard link of a file into a directory of another MDT: the file stays on its MDT and counts
/// the name (its link count and the names it has elsewhere), each name reads the same bytes,
/// a refused link counts nothing, and the file goes with its last name, wherever that is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_linked_from_another_mdt_counts_every_name_and_goes_with_the_last() {
    let (dir, c, admin) = three_mdts("lode-links", |b| b).await;
    admin.mkdir("/a", 0o755).await.unwrap();
    admin.mkdir_on("/b", 0o755, 1).await.unwrap();
    admin.mkdir_on("/c", 0o755, 2).await.unwrap();
    let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    write(&admin, "/a/f", &bytes).await.unwrap();
    let f = admin.stat("/a/f").await.unwrap();
    let linked = admin.link("/a/f", "/b/l").await.unwrap();
    assert_eq!((linked.fid, linked.nlink), (f.fid, 2));
    admin.link("/a/f", "/c/l").await.unwrap();
    let other = root_client(&c, "other").await;
    for p in ["/a/f", "/b/l", "/c/l"] {
        let st = other.stat(p).await.unwrap();
        assert_eq!((st.fid, st.nlink, st.size), (f.fid, 3, f.size), "{p}");
        assert!(read(&other, p).await == bytes[..65536], "{p}");
    }
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");

    // Refused by the other MDT: the name is taken, or the file has a name there already
    // (one per MDT for another MDT's file). Nothing is counted.
    write(&admin, "/b/taken", b"t").await.unwrap();
    write(&admin, "/a/h", b"h").await.unwrap();
    let e = admin.link("/a/h", "/b/taken").await.unwrap_err();
    assert!(e.is(FsErrorKind::Exists), "{e}");
    assert_eq!(read(&admin, "/b/taken").await, b"t");
    assert_eq!(admin.stat("/a/h").await.unwrap().nlink, 1);
    let e = admin.link("/a/f", "/b/second").await.unwrap_err();
    assert!(e.is(FsErrorKind::CrossDevice), "{e}");
    // Write and search on the directory, for the caller.
    admin.mkdir_on("/b/locked", 0o755, 1).await.unwrap();
    let user = user_client(&c).await;
    let e = user.link("/a/h", "/b/locked/u").await.unwrap_err();
    assert!(e.is(FsErrorKind::NotPermitted), "{e}");
    // Protected hard links: root's file, which the user may not write, is not theirs to link
    // (checked at its home); their own file still needs the directory's write right there.
    admin.mkdir("/a/mine", 0o777).await.unwrap();
    write(&user, "/a/mine/u", b"u").await.unwrap();
    let e = user.link("/a/mine/u", "/b/locked/u").await.unwrap_err();
    assert!(e.is(FsErrorKind::AccessDenied), "{e}");
    assert_eq!(user.stat("/a/mine/u").await.unwrap().nlink, 1);
    assert_eq!(admin.stat("/a/f").await.unwrap().nlink, 3);
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");

    // Its names go one by one, the home's first: the file stays until the last.
    admin.unlink("/a/f").await.unwrap();
    assert!(read(&other, "/b/l").await == bytes[..65536]);
    admin.unlink("/b/l").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.stat("/c/l").await.unwrap().nlink != 1 {
        assert!(
            Instant::now() < deadline,
            "a removed name was never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(read(&other, "/c/l").await == bytes[..65536]);
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    admin.unlink("/c/l").await.unwrap();
    gone(&admin, f.fid).await;

    // As an attacker with the client key: the steps are the servers' own, and another MDT's
    // file is linked only by its home.
    write(&admin, "/a/g", b"g").await.unwrap();
    let g = admin.stat("/a/g").await.unwrap();
    admin.link("/a/g", "/b/g").await.unwrap();
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let b = admin.stat("/b").await.unwrap().fid;
    let a = admin.stat("/").await.unwrap().fid;
    let forged = Linking {
        fid: g.fid,
        new_parent: b,
        new_name: b"forged".to_vec(),
        creds: Creds::root(),
        client_req: None,
        peer_req: ReqId { client: 7, seq: 7 },
    };
    for (to, m, code) in [
        (
            0,
            Mutation::LinkOut {
                linking: forged.clone(),
            },
            FsErrorKind::NotPermitted,
        ),
        (
            0,
            Mutation::LinkDone {
                fid: g.fid,
                peer_req: forged.peer_req,
            },
            FsErrorKind::NotPermitted,
        ),
        (
            0,
            Mutation::LinkAbort {
                fid: g.fid,
                peer_req: forged.peer_req,
            },
            FsErrorKind::NotPermitted,
        ),
        (
            1,
            Mutation::Link {
                fid: g.fid,
                parent: b,
                name: b"again".to_vec(),
            },
            FsErrorKind::CrossDevice,
        ),
        // Nor are the records of a mkdir or rmdir across MDTs a client's to make or end.
        (
            0,
            Mutation::PlaceOut {
                parent: a,
                placing: Placing {
                    name: b"b".to_vec(),
                    mdt: 1,
                    step: Box::new(Mutation::RmdirRemote { fid: b }),
                    creds: Creds::root(),
                    client_req: None,
                    peer_req: ReqId { client: 7, seq: 8 },
                },
            },
            FsErrorKind::NotPermitted,
        ),
        (
            0,
            Mutation::PlaceDone {
                parent: a,
                name: b"b".to_vec(),
            },
            FsErrorKind::NotPermitted,
        ),
        (
            0,
            Mutation::PlaceAbort {
                parent: a,
                name: b"b".to_vec(),
            },
            FsErrorKind::NotPermitted,
        ),
    ] {
        let r = MdsReint::durable(Creds::root(), m);
        match call(&raw, &c.mdt(to).unwrap().nid(), &r, T).await {
            Err(NetError::Remote { err, .. }) => {
                assert_eq!(err.code, StatusCode::Fs(code), "{err:?}")
            }
            other => panic!("a client's step of a link: {other:?}"),
        }
    }
    assert_eq!(admin.stat("/b/g").await.unwrap().nlink, 2);
    assert_eq!(admin.stat("/b").await.unwrap().fid, b);
    let problems = fsck_all(&c);
    assert!(problems.is_empty(), "{problems:?}");
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The mirror healer heals every MDT's files: a copy that went stale while its storage server
/// was down is resynced in the background once the server is back, for a file of MDT1 as for
/// one of MDT0, and both copies read the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_mirrors_of_every_mdt_are_resynced_in_the_background() {
    let heal = client::mirrors::HealConfig {
        rate: 0,
        move_after: Duration::from_secs(600),
        every: Duration::from_millis(200),
        mdt: None,
    };
    let (dir, mut c, admin) =
        three_mdts("lode-heal-mdts", |b| b.heal(heal, ClientConfig::default())).await;
    admin.mkdir_on("/m1", 0o755, 1).await.unwrap();
    let two = client::stripe_args::parse(&["-N", "2", "-c", "1"].map(String::from)).unwrap();
    let paths = ["/f0", "/m1/f1"];
    let write_all = |bytes: Vec<u8>| {
        let (admin, two) = (admin.clone(), two.clone());
        async move {
            for p in paths {
                let f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .layout(two.clone())
                    .open(&admin, p)
                    .await
                    .unwrap();
                f.write_at(0, &bytes).await.unwrap();
                f.fsync().await.unwrap();
                f.close().await.unwrap();
            }
        }
    };
    write_all(vec![1u8; 100_000]).await;
    assert_eq!(mdt_of(admin.stat("/m1/f1").await.unwrap().fid), Some(1));
    // One server down: the copies on it go stale as the files are written again.
    c.kill_oss(1);
    let newer: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
    write_all(newer.clone()).await;
    for p in paths {
        let l = admin.getstripe(p).await.unwrap().unwrap();
        assert_eq!(l.stale_mirrors().len(), 1, "{p}");
    }
    c.start_oss(1).await.unwrap();
    // A new client: the server came back at a new address here, which the writer's client,
    // holding the old one, would wait out before it asked the MDS again.
    let admin = root_client(&c, "after").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    for p in paths {
        loop {
            let l = admin.getstripe(p).await.unwrap().unwrap();
            if l.stale_mirrors().is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{p}'s stale copy was never resynced"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let f = OpenOptions::new().read(true).open(&admin, p).await.unwrap();
        for copy in 0..2 {
            let back = f.read_copy(copy, 0, newer.len() as u64).await.unwrap();
            assert!(back == newer, "{p}: copy {copy} differs");
        }
        f.close().await.unwrap();
    }
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits until `fid` is gone at its MDT (a removal reported from another MDT lands there
/// shortly after it is answered).
async fn gone(c: &Client, fid: proto::Fid) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.getattr(fid).await {
            Err(e) if e.is(FsErrorKind::Stale) => return,
            Ok(_) | Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("{fid} never went: {other:?}"),
        }
    }
}

/// Two clients renaming files back and forth between directories of MDT0 and MDT1, a third
/// linking files of MDT0 into MDT1's directory and unlinking them there, and a fourth moving
/// directories (of /x's MDT and of MDT2) between the two, while each MDS (MDT2's too) is
/// killed -9 in turn and started again: afterwards every moved file has exactly one name, each
/// linked file as many names as its link count, all with their own bytes, and the MDTs check
/// clean against each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_across_mdts_survive_kill_9_of_either_mds_with_every_file_named_once() {
    let (dir, mut c, admin) = three_mdts("lode-moves-kill", |b| {
        b.open_recovery(Duration::from_millis(500), Duration::from_secs(120))
    })
    .await;
    admin.mkdir("/x", 0o755).await.unwrap();
    admin.mkdir_on("/y", 0o755, 1).await.unwrap();
    const FILES: usize = 8;
    for i in 0..FILES {
        write(&admin, &format!("/x/f{i}"), format!("file {i}").as_bytes())
            .await
            .unwrap();
    }
    // Files of MDT0 that a third client links into /y and unlinks there, over and over.
    const LINKED: usize = 4;
    for j in 0..LINKED {
        write(
            &admin,
            &format!("/x/g{j}"),
            format!("linked {j}").as_bytes(),
        )
        .await
        .unwrap();
    }
    // Directories a fourth client moves between /x and /y: one of /x's MDT, one of MDT2.
    const DIRS: usize = 2;
    for k in 0..DIRS {
        let d = format!("/x/d{k}");
        if k == 0 {
            admin.mkdir(&d, 0o755).await.unwrap();
        } else {
            admin.mkdir_on(&d, 0o755, 2).await.unwrap();
        }
        write(&admin, &format!("{d}/in"), format!("dir {k}").as_bytes())
            .await
            .unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dir_mover = {
        let cl = root_client(&c, "dirmover").await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut moved = 0u64;
            let mut round = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (from, to) = if round % 2 == 0 {
                    ("x", "y")
                } else {
                    ("y", "x")
                };
                for k in 0..DIRS {
                    match cl
                        .rename(&format!("/{from}/d{k}"), &format!("/{to}/d{k}"))
                        .await
                    {
                        Ok(()) => moved += 1,
                        Err(e) if e.is(FsErrorKind::NotFound) => {}
                        Err(e) => tracing_like(&e),
                    }
                }
                round += 1;
            }
            moved
        })
    };
    let linker = {
        let cl = root_client(&c, "linker").await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut linked = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for j in 0..LINKED {
                    match cl.link(&format!("/x/g{j}"), &format!("/y/g{j}")).await {
                        Ok(_) => linked += 1,
                        Err(e) => tracing_like(&e),
                    }
                    if let Err(e) = cl.unlink(&format!("/y/g{j}")).await {
                        tracing_like(&e);
                    }
                }
            }
            linked
        })
    };
    let mut loops = vec![];
    for k in 0..2usize {
        let cl = root_client(&c, &format!("mover{k}")).await;
        let stop = stop.clone();
        loops.push(tokio::spawn(async move {
            let mut moved = 0u64;
            let mut round = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Client k moves the files i with i % 2 == k, each between /x and /y.
                for i in (k..FILES).step_by(2) {
                    let (from, to) = if round % 2 == 0 {
                        ("x", "y")
                    } else {
                        ("y", "x")
                    };
                    match cl
                        .rename(&format!("/{from}/f{i}"), &format!("/{to}/f{i}"))
                        .await
                    {
                        Ok(()) => moved += 1,
                        // Cut short by a crash: it happened, or did not; the next round
                        // finds out which.
                        Err(e) if e.is(FsErrorKind::NotFound) => {}
                        Err(e) => tracing_like(&e),
                    }
                }
                round += 1;
            }
            moved
        }));
    }
    // MDT2 holds one of the directories moved (its parent changes there).
    for victim in [0u32, 1, 2, 0, 1] {
        tokio::time::sleep(Duration::from_millis(400)).await;
        if victim == 0 {
            c.kill_mds().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            c.start_mds().await.unwrap();
        } else {
            c.kill_mdt(victim).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            c.start_mdt(victim).await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut moved = 0;
    for l in loops {
        moved += l.await.unwrap();
    }
    let linked = linker.await.unwrap();
    let dirs_moved = dir_mover.await.unwrap();
    eprintln!(
        "{moved} renames of files, {dirs_moved} of directories and {linked} links across MDTs \
         answered during the crashes"
    );
    assert!(moved > 0 && linked > 0 && dirs_moved > 0);
    // Every move cut short is ended by its MDS; then each file is in exactly one place.
    let check = root_client(&c, "check").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut seen: HashMap<String, usize> = HashMap::new();
        for d in ["/x", "/y"] {
            for n in names(check.readdir(d).await.unwrap()) {
                *seen.entry(n).or_default() += 1;
            }
        }
        let once = (0..FILES).all(|i| seen.get(&format!("f{i}")) == Some(&1))
            && (0..DIRS).all(|k| seen.get(&format!("d{k}")) == Some(&1));
        // Each linked file has its name in /x, and in /y if the last link stood; its link
        // count says as many (fsck checks the counts across the MDTs).
        let mut counted = true;
        for j in 0..LINKED {
            let names = seen.get(&format!("g{j}")).copied().unwrap_or(0);
            let nlink = check.stat(&format!("/x/g{j}")).await.unwrap().nlink as usize;
            counted &= names == nlink;
        }
        let problems = fsck_all(&c);
        if once && counted && seen.len() == FILES + LINKED + DIRS && problems.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the crashes: {seen:?}; {problems:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for j in 0..LINKED {
        assert_eq!(
            read(&check, &format!("/x/g{j}")).await,
            format!("linked {j}").as_bytes()
        );
    }
    for k in 0..DIRS {
        let at = if check.stat(&format!("/x/d{k}")).await.is_ok() {
            "x"
        } else {
            "y"
        };
        assert_eq!(
            read(&check, &format!("/{at}/d{k}/in")).await,
            format!("dir {k}").as_bytes()
        );
    }
    assert_eq!(c.mdt(0).unwrap().namespace().rename_lock(), None);
    for i in 0..FILES {
        let at = if check.stat(&format!("/x/f{i}")).await.is_ok() {
            "x"
        } else {
            "y"
        };
        assert_eq!(
            read(&check, &format!("/{at}/f{i}")).await,
            format!("file {i}").as_bytes()
        );
    }
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An error a mover meets while a server is down: a crash mid-rename may answer anything but
/// a lost file, which the check at the end finds.
fn tracing_like(e: &client::ClientError) {
    eprintln!("rename during the crashes: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_directory_layout_lays_out_new_subdirectories_and_goes_down_as_far_as_it_says() {
    let (dir, c, admin) = three_mdts("lode-dirdefault", |b| b).await;
    use proto::dirstripe::{DirDefault, INHERIT_ALWAYS};
    let striped2 = DirDefault {
        count: 2,
        offset: None,
        hash: HashType::Fnv1a64.code(),
        inherit: INHERIT_ALWAYS,
    };
    admin.mkdir_on("/data", 0o755, 0).await.unwrap();
    assert_eq!(admin.dir_default("/data").await.unwrap(), None);
    admin
        .set_dir_default("/data", Some(striped2))
        .await
        .unwrap();
    assert_eq!(admin.dir_default("/data").await.unwrap(), Some(striped2));
    // Every new subdirectory, at any depth, is striped over two MDTs, and works as one.
    let mut at = "/data".to_string();
    for depth in 0..3 {
        at = format!("{at}/d{depth}");
        let made = admin.mkdir(&at, 0o755).await.unwrap();
        let stripe = admin.dir_stripe(made.fid).await.unwrap().expect("striped");
        assert_eq!(
            (stripe.count, stripe.state),
            (2, StripeState::Ready),
            "{at}"
        );
        assert_eq!(
            admin.dir_default(&at).await.unwrap(),
            Some(striped2),
            "{at}"
        );
        for i in 0..6 {
            write(&admin, &format!("{at}/f{i}"), &[i; 3]).await.unwrap();
        }
        assert_eq!(read(&admin, &format!("{at}/f5")).await, [5; 3]);
    }
    // A mkdir that says where goes there all the same.
    let pinned = admin.mkdir_on("/data/pinned", 0o755, 2).await.unwrap();
    assert_eq!(mdt_of(pinned.fid), Some(2));
    assert!(admin.dir_stripe(pinned.fid).await.unwrap().is_none());

    // On one MDT, one level further down: /one/a on MDT2 with the default, /one/a/b on MDT2
    // without it, /one/a/b/c plain on b's MDT.
    admin.mkdir_on("/one", 0o755, 0).await.unwrap();
    let on2 = DirDefault {
        count: 1,
        offset: Some(2),
        hash: HashType::Fnv1a64.code(),
        inherit: 1,
    };
    admin.set_dir_default("/one", Some(on2)).await.unwrap();
    let a = admin.mkdir("/one/a", 0o755).await.unwrap();
    assert_eq!(mdt_of(a.fid), Some(2));
    assert_eq!(
        admin.dir_default("/one/a").await.unwrap(),
        Some(DirDefault { inherit: 0, ..on2 })
    );
    let b = admin.mkdir("/one/a/b", 0o755).await.unwrap();
    assert_eq!(mdt_of(b.fid), Some(2));
    assert_eq!(admin.dir_default("/one/a/b").await.unwrap(), None);
    // Removed: new subdirectories are plain again, on their parent's MDT.
    admin.set_dir_default("/one", None).await.unwrap();
    assert_eq!(admin.dir_default("/one").await.unwrap(), None);
    let plain = admin.mkdir("/one/plain", 0o755).await.unwrap();
    assert_eq!(mdt_of(plain.fid), Some(0));

    // A default set on a striped directory reaches its shards, where the names are.
    let s = admin
        .mkdir_striped("/s", 0o755, 3, Some(0), HashType::Fnv1a64)
        .await
        .unwrap();
    admin.set_dir_default("/s", Some(on2)).await.unwrap();
    for i in 0..6 {
        let sub = admin.mkdir(&format!("/s/sub{i}"), 0o755).await.unwrap();
        assert_eq!(mdt_of(sub.fid), Some(2), "/s/sub{i}");
    }
    let _ = s;

    // Only the directory's owner (or root) sets it, whatever a client sends, and only a
    // default that makes sense.
    let user = user_client(&c).await;
    let e = user.set_dir_default("/data", Some(on2)).await.unwrap_err();
    assert!(e.is(FsErrorKind::NotPermitted), "{e}");
    assert_eq!(admin.dir_default("/data").await.unwrap(), Some(striped2));
    let raw = TcpEndpoint::client(TcpConfig {
        security: c.client_security(),
        ..TcpConfig::default()
    });
    let data = admin.stat("/data").await.unwrap();
    for value in [
        b"garbage".to_vec(),
        DirDefault { count: 0, ..on2 }.encode(),
        DirDefault { hash: 77, ..on2 }.encode(),
        DirDefault {
            offset: Some(proto::fid::MAX_MDTS),
            ..on2
        }
        .encode(),
    ] {
        let r = MdsReint::durable(
            Creds::root(),
            Mutation::SetXattr {
                fid: data.fid,
                name: proto::dirstripe::DEFAULT_XATTR.into(),
                value,
            },
        );
        match call(&raw, &c.mds().nid(), &r, T).await {
            Err(NetError::Remote { err, .. }) => {
                assert_eq!(err.code, StatusCode::Fs(FsErrorKind::Invalid), "{err:?}")
            }
            other => panic!("a malformed default was taken: {other:?}"),
        }
    }
    assert_eq!(admin.dir_default("/data").await.unwrap(), Some(striped2));
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
