//! HSM against a real S3-compatible server (moto's, started by the test on loopback), with the
//! MDS, storage servers and the copytool as processes: a linked bucket's names imported
//! without their bytes, restored on first read (a range before the whole), files archived,
//! released and read back byte-exact, a change marking a file dirty, a failed restore an
//! error and never zeros, a hostile client refused, and the queue carried across an MDS
//! `kill -9`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use lode_tests::{mds_of, oss_of, scratch, Copytool, S3Server, Server, S3_KEY};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{ObjectStore, PutPayload};
use proto::hsm::{Policy, State};
use proto::md::Creds;
use proto::{FsErrorKind, Nid};

const BUCKET: &str = "lode-hsm";

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i.wrapping_mul(0x9E37_79B9) >> 7) ^ seed) as u8)
        .collect()
}

fn store(s3: &S3Server) -> Arc<dyn ObjectStore> {
    Arc::new(
        AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_endpoint(&s3.endpoint)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_region("us-east-1")
            .with_access_key_id(S3_KEY.0)
            .with_secret_access_key(S3_KEY.1)
            .build()
            .unwrap(),
    )
}

async fn put(s: &Arc<dyn ObjectStore>, key: &str, data: Vec<u8>) {
    s.put(&Key::from(key), PutPayload::from(data))
        .await
        .unwrap();
}

async fn connect(mds: &Nid, security: lnet::auth::Security, creds: Option<Creds>) -> Client {
    let mut cfg = ClientConfig {
        security: Some(security),
        retry_for: Duration::from_secs(30),
        ping_every: Duration::from_millis(500),
        ..Default::default()
    };
    if let Some(c) = creds {
        cfg.creds = c;
    }
    Client::connect_with(&mds.to_string(), cfg).await.unwrap()
}

struct Cluster {
    root: std::path::PathBuf,
    mds: Option<Server>,
    nid: Nid,
    _oss: Vec<Server>,
    s3: S3Server,
    /// With the cluster key: an administrator.
    admin: Client,
}

impl Cluster {
    async fn start(name: &str) -> Cluster {
        let root = scratch(name);
        let s3 = S3Server::start(BUCKET);
        let mds = mds_of(&root);
        let oss = (0..2)
            .map(|k| oss_of(&root.join(format!("oss{k}")), &mds.nid))
            .collect();
        let admin = connect(&mds.nid, lode_tests::server_security(), None).await;
        let until = Instant::now() + Duration::from_secs(20);
        while admin.targets().await.map_or(0, |t| t.len()) < 2 {
            assert!(
                Instant::now() < until,
                "the storage servers did not register"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Cluster {
            root,
            nid: mds.nid.clone(),
            mds: Some(mds),
            _oss: oss,
            s3,
            admin,
        }
    }

    async fn link(&self, dir: &str, prefix: &str) {
        self.link_exporting(dir, prefix, Policy::default()).await
    }

    async fn link_exporting(&self, dir: &str, prefix: &str, export: Policy) {
        self.admin.mkdir_all(dir, 0o777).await.unwrap();
        self.admin
            .hsm_link(
                dir,
                &format!("s3://{BUCKET}/{prefix}"),
                Some(self.s3.endpoint.clone()),
                None,
                Policy::parse("new,changed").unwrap(),
                export,
            )
            .await
            .unwrap();
    }
}

async fn state(c: &Client, path: &str) -> State {
    let fid = c.stat(path).await.unwrap().fid;
    c.hsm_state(fid).await.unwrap().unwrap_or_default()
}

/// Waits until `path` exists (an import names it).
async fn appears(c: &Client, path: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while c.stat(path).await.is_err() {
        assert!(Instant::now() < until, "{path} was never imported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `path`'s state passes `ok`.
async fn until_state(c: &Client, path: &str, ok: impl Fn(&State) -> bool) -> State {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s = state(c, path).await;
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < until, "{path} stayed {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn read_all(c: &Client, path: &str) -> client::Result<Vec<u8>> {
    let f = OpenOptions::new().read(true).open(c, path).await?;
    let size = f.inode().size as usize;
    let mut buf = vec![0u8; size];
    let mut at = 0;
    while at < size {
        let n = f.read_at(at as u64, &mut buf[at..]).await?;
        assert!(n > 0, "{path} ended at {at} of {size}");
        at += n;
    }
    f.close().await?;
    Ok(buf)
}

async fn write(c: &Client, path: &str, data: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(c, path)
        .await
        .unwrap();
    f.write_at(0, data).await.unwrap();
    f.fsync().await.unwrap();
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_bucket_is_imported_restored_on_read_and_files_archive_release_and_restore() {
    let cl = Cluster::start("hsm-cycle").await;
    let s3 = store(&cl.s3);
    let small = b"hello from the archive\n".to_vec();
    let big = pattern(7, (5 << 20) + 3);
    put(&s3, "set/a.txt", small.clone()).await;
    put(&s3, "set/d/big.bin", big.clone()).await;
    let _tool = Copytool::start(&cl.nid);
    cl.link("/lake", "set").await;
    let c = connect(&cl.nid, lode_tests::client_security(), None).await;
    appears(&c, "/lake/d/big.bin").await;
    appears(&c, "/lake/a.txt").await;

    // Names, sizes and states without the bytes: no storage server holds any of them.
    let i = c.stat("/lake/d/big.bin").await.unwrap();
    assert_eq!(i.size, big.len() as u64);
    let s = state(&c, "/lake/d/big.bin").await;
    assert!(s.archived && s.released && !s.dirty, "{s:?}");
    assert_eq!(s.key, "set/d/big.bin");
    assert!(i
        .layout
        .as_ref()
        .unwrap()
        .components
        .iter()
        .all(|c| c.objects.is_empty() && c.stale));

    // The first read restores: a range first, then the whole.
    let f = OpenOptions::new()
        .read(true)
        .open(&c, "/lake/d/big.bin")
        .await
        .unwrap();
    let mut part = vec![0u8; 1 << 20];
    let n = f.read_at(4 << 20, &mut part).await.unwrap();
    assert_eq!(n, 1 << 20);
    assert_eq!(part, big[4 << 20..5 << 20]);
    f.close().await.unwrap();
    assert_eq!(read_all(&c, "/lake/d/big.bin").await.unwrap(), big);
    assert_eq!(read_all(&c, "/lake/a.txt").await.unwrap(), small);
    let s = until_state(&c, "/lake/d/big.bin", |s| !s.released && s.action.is_none()).await;
    assert!(s.archived && !s.dirty, "{s:?}");

    // A file made in lode: archived (its object holds its bytes), released (no objects
    // left), read back byte-exact (restored).
    let new = pattern(11, (3 << 20) + 77);
    c.mkdir("/lake/out", 0o755).await.unwrap();
    write(&c, "/lake/out/new.bin", &new).await;
    c.hsm_archive("/lake/out/new.bin").await.unwrap();
    let s = until_state(&c, "/lake/out/new.bin", |s| s.action.is_none()).await;
    assert!(s.archived && !s.dirty && !s.released, "{s:?}");
    assert_eq!(s.key, "set/out/new.bin");
    let there = s3
        .get(&Key::from("set/out/new.bin"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(there.as_ref(), &new[..]);
    c.hsm_release("/lake/out/new.bin").await.unwrap();
    let i = c.stat("/lake/out/new.bin").await.unwrap();
    assert!(i
        .layout
        .as_ref()
        .unwrap()
        .components
        .iter()
        .all(|c| c.objects.is_empty()));
    assert!(state(&c, "/lake/out/new.bin").await.released);
    // Four readers at once: one restore, and every reader gets the bytes.
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { read_all(&c, "/lake/out/new.bin").await })
        })
        .collect();
    for r in readers {
        assert_eq!(r.await.unwrap().unwrap(), new);
    }
    assert!(!state(&c, "/lake/out/new.bin").await.released);

    // An open file is not released; a changed one is dirty and is not released.
    let held = OpenOptions::new()
        .read(true)
        .open(&c, "/lake/a.txt")
        .await
        .unwrap();
    let e = c.hsm_release("/lake/a.txt").await.unwrap_err();
    assert!(e.is(FsErrorKind::Busy), "{e}");
    held.close().await.unwrap();
    write(&c, "/lake/a.txt", b"changed here").await;
    let s = state(&c, "/lake/a.txt").await;
    assert!(s.archived && s.dirty, "{s:?}");
    let e = c.hsm_release("/lake/a.txt").await.unwrap_err();
    assert!(e.is(FsErrorKind::Busy), "{e}");
    // Archived again, it is clean.
    c.hsm_archive("/lake/a.txt").await.unwrap();
    let s = until_state(&c, "/lake/a.txt", |s| s.action.is_none()).await;
    assert!(s.archived && !s.dirty, "{s:?}");
    let _ = std::fs::remove_dir_all(&cl.root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_exports_archives_files_closed_after_writing_and_again_once_changed() {
    let cl = Cluster::start("hsm-export").await;
    let s3 = store(&cl.s3);
    let _tool = Copytool::start(&cl.nid);
    cl.link_exporting("/out", "exp", Policy::parse("new,changed").unwrap())
        .await;
    let c = connect(&cl.nid, lode_tests::client_security(), None).await;
    c.mkdir("/out/run1", 0o755).await.unwrap();
    let first = pattern(21, (2 << 20) + 5);
    write(&c, "/out/run1/ckpt.bin", &first).await;
    let s = until_state(&c, "/out/run1/ckpt.bin", |s| {
        s.archived && s.action.is_none()
    })
    .await;
    assert_eq!(s.key, "exp/run1/ckpt.bin");
    let there = s3.get(&Key::from("exp/run1/ckpt.bin")).await.unwrap();
    assert_eq!(there.bytes().await.unwrap().as_ref(), &first[..]);
    // Changed: dirty, then archived again on its own.
    let second = pattern(22, 1 << 20);
    write(&c, "/out/run1/ckpt.bin", &second).await;
    until_state(&c, "/out/run1/ckpt.bin", |s| {
        s.archived && !s.dirty && s.action.is_none() && s.size == second.len() as u64
    })
    .await;
    let there = s3.get(&Key::from("exp/run1/ckpt.bin")).await.unwrap();
    assert_eq!(there.bytes().await.unwrap().as_ref(), &second[..]);
    let _ = std::fs::remove_dir_all(&cl.root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_again_brings_in_new_changed_and_deleted_objects() {
    let cl = Cluster::start("hsm-reimport").await;
    let s3 = store(&cl.s3);
    put(&s3, "re/a.bin", pattern(1, 70_000)).await;
    put(&s3, "re/b.bin", pattern(2, 80_000)).await;
    put(&s3, "re/kept.bin", pattern(3, 90_000)).await;
    let _tool = Copytool::start(&cl.nid);
    cl.admin.mkdir_all("/re", 0o777).await.unwrap();
    cl.admin
        .hsm_link(
            "/re",
            &format!("s3://{BUCKET}/re"),
            Some(cl.s3.endpoint.clone()),
            None,
            Policy::parse("new,changed,deleted").unwrap(),
            Policy::default(),
        )
        .await
        .unwrap();
    let c = connect(&cl.nid, lode_tests::client_security(), None).await;
    appears(&c, "/re/b.bin").await;
    appears(&c, "/re/kept.bin").await;
    // kept.bin is read (its bytes in lode now): it stays even once its object is deleted.
    assert_eq!(
        read_all(&c, "/re/kept.bin").await.unwrap(),
        pattern(3, 90_000)
    );
    let changed = pattern(4, 123_456);
    put(&s3, "re/a.bin", changed.clone()).await;
    s3.delete(&Key::from("re/b.bin")).await.unwrap();
    s3.delete(&Key::from("re/kept.bin")).await.unwrap();
    put(&s3, "re/c.bin", pattern(5, 1000)).await;
    cl.admin.hsm_import_again("/re").await.unwrap();
    appears(&c, "/re/c.bin").await;
    let until = Instant::now() + Duration::from_secs(30);
    while c.stat("/re/b.bin").await.is_ok() || c.stat("/re/a.bin").await.unwrap().size != 123_456 {
        assert!(
            Instant::now() < until,
            "the changed and deleted objects were not brought in"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(read_all(&c, "/re/a.bin").await.unwrap(), changed);
    assert_eq!(
        read_all(&c, "/re/kept.bin").await.unwrap(),
        pattern(3, 90_000)
    );
    let _ = std::fs::remove_dir_all(&cl.root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_fails_is_an_error_never_zeros() {
    let cl = Cluster::start("hsm-lost").await;
    let s3 = store(&cl.s3);
    put(&s3, "gone/x.bin", pattern(3, 100_000)).await;
    put(&s3, "gone/y.bin", pattern(5, 100_000)).await;
    let _tool = Copytool::start(&cl.nid);
    cl.link("/lost", "gone").await;
    let c = connect(&cl.nid, lode_tests::client_security(), None).await;
    appears(&c, "/lost/x.bin").await;
    appears(&c, "/lost/y.bin").await;
    // Gone from S3: the read fails with the S3 error.
    s3.delete(&Key::from("gone/x.bin")).await.unwrap();
    let e = read_all(&c, "/lost/x.bin").await.unwrap_err();
    assert!(e.is(FsErrorKind::Io), "{e}");
    assert!(e.to_string().contains("restoring"), "{e}");
    let s = state(&c, "/lost/x.bin").await;
    assert!(s.released && s.action.is_none(), "{s:?}");
    // Changed in S3 since it was archived: not restored in its place either.
    put(&s3, "gone/y.bin", pattern(6, 100_000)).await;
    let e = read_all(&c, "/lost/y.bin").await.unwrap_err();
    assert!(e.is(FsErrorKind::Io), "{e}");
    assert!(
        e.to_string().contains("changed since it was archived"),
        "{e}"
    );
    assert!(state(&c, "/lost/y.bin").await.released);
    let _ = std::fs::remove_dir_all(&cl.root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_the_client_key_cannot_link_take_work_or_forge_a_state() {
    let cl = Cluster::start("hsm-hostile").await;
    let user = Creds {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    };
    let c = connect(&cl.nid, lode_tests::client_security(), Some(user)).await;
    cl.admin.mkdir_all("/mine", 0o777).await.unwrap();
    let e = c
        .hsm_link(
            "/mine",
            &format!("s3://{BUCKET}/x"),
            Some(cl.s3.endpoint.clone()),
            None,
            Policy::default(),
            Policy::default(),
        )
        .await
        .unwrap_err();
    assert!(e.is(FsErrorKind::NotPermitted), "{e}");
    let e = c.hsm_take(1, 8).await.unwrap_err();
    assert!(e.is(FsErrorKind::NotPermitted), "{e}");
    write(&c, "/mine/f", b"bytes").await;
    let fid = c.stat("/mine/f").await.unwrap().fid;
    let forged = State {
        archived: true,
        released: true,
        ..State::default()
    };
    let e = c
        .reint(proto::md::Mutation::HsmSet {
            fid,
            state: forged.encode(),
            release: true,
            restored: None,
        })
        .await
        .unwrap_err();
    assert!(e.is(FsErrorKind::NotPermitted), "{e}");
    let e = c
        .reint(proto::md::Mutation::SetXattr {
            fid,
            name: proto::hsm::STATE_XATTR.into(),
            value: forged.encode(),
        })
        .await
        .unwrap_err();
    assert!(!e.is(FsErrorKind::Exists), "{e}");
    assert_eq!(c.hsm_state(fid).await.unwrap(), None);
    // Another user's file is neither archived nor released by this one.
    cl.admin.mkdir_all("/theirs", 0o755).await.unwrap();
    write(&cl.admin, "/theirs/g", b"root's").await;
    let e = c.hsm_release("/theirs/g").await.unwrap_err();
    assert!(e.is(FsErrorKind::AccessDenied), "{e}");
    let _ = std::fs::remove_dir_all(&cl.root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_actions_survive_a_kill_9_of_the_mds_and_a_copytool_killed_mid_restore() {
    let mut cl = Cluster::start("hsm-crash").await;
    let s3 = store(&cl.s3);
    let big = pattern(9, 48 << 20);
    put(&s3, "c/big.bin", big.clone()).await;
    cl.link("/ck", "c").await;
    // No copytool yet: the import waits in the queue, across a kill -9 of the MDS.
    let listen = cl.nid.to_string().trim_end_matches("@tcp").to_owned();
    cl.mds.take().unwrap().kill();
    cl.mds = Some(
        Server::start(
            "lode-mds",
            &[
                "--data-dir",
                cl.root.join("mds").to_str().unwrap(),
                "--listen",
                &listen,
                "--recovery-window-s",
                "4",
            ],
        )
        .unwrap(),
    );
    let tool = Copytool::start(&cl.nid);
    let c = connect(&cl.nid, lode_tests::client_security(), None).await;
    appears(&c, "/ck/big.bin").await;
    // A restore under way when its copytool dies is carried out by the next one.
    let fid = c.stat("/ck/big.bin").await.unwrap().fid;
    let r = c.hsm_restore_step(fid, 1 << 20).await.unwrap();
    assert!(r.done || r.landed >= 1 << 20);
    tool.kill();
    let _tool = Copytool::start(&cl.nid);
    assert_eq!(read_all(&c, "/ck/big.bin").await.unwrap(), big);
    let s = until_state(&c, "/ck/big.bin", |s| s.action.is_none()).await;
    assert!(s.archived && !s.released, "{s:?}");
    let _ = std::fs::remove_dir_all(&cl.root);
}
