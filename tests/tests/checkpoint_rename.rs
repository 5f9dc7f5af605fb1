//! The checkpoint primitive under fire: a writer creates a temporary file, gives it its
//! version, and renames it over the checkpoint's name, again and again, while the MDS is killed
//! with `kill -9` at random moments and restarted. After every restart the name must hold one
//! whole version, never none and never a mix, and no acknowledged rename may be lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lnet::call;
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lode_tests::{run, scratch, Server};
use proto::md::*;
use proto::Nid;

use proto::fid::ROOT;
const T: Duration = Duration::from_secs(5);

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

/// One checkpoint: write the temporary file, then rename it over the name.
async fn checkpoint(c: &TcpEndpoint, mds: &Nid, v: u64) -> Result<(), lnet::NetError> {
    let tmp = format!("ckpt.tmp.{v}").into_bytes();
    let create = Mutation::Create {
        parent: ROOT,
        name: tmp.clone(),
        kind: Kind::File,
        mode: 0o644,
        exclusive: true,
        target: vec![],
        layout: None,
    };
    let fid = call(c, mds, &reint(create), T)
        .await?
        .inode
        .expect("created")
        .fid;
    let size = Mutation::Setattr {
        fid,
        attr: SetAttr {
            size: Some(v * 1000),
            ..Default::default()
        },
    };
    call(c, mds, &reint(size), T).await?;
    let tag = Mutation::SetXattr {
        fid,
        name: "user.version".into(),
        value: v.to_string().into_bytes(),
    };
    call(c, mds, &reint(tag), T).await?;
    let rename = Mutation::Rename {
        parent: ROOT,
        name: tmp,
        new_parent: ROOT,
        new_name: b"ckpt".to_vec(),
        flags: RenameFlags::default(),
    };
    call(c, mds, &reint(rename), T).await?;
    Ok(())
}

// Long by design: kills at every moment of one save loop, each checked after restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_over_a_checkpoint_survives_kill_9_at_any_moment() {
    let root = scratch("ckpt-rename");
    let dir = root.join("mds");
    let mut mds = Server::start(
        "lode-mds",
        &[
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .unwrap();
    let addr = mds.nid.to_string().replace("@tcp", "");
    let client = Arc::new(TcpEndpoint::client(TcpConfig {
        security: lode_tests::client_security(),
        ..TcpConfig::default()
    }));
    let acked = Arc::new(AtomicU64::new(0));
    let mut next = 1u64;
    let mut seed = 0x5eed_u64;
    for round in 0..12 {
        // A writer runs until the server dies under it.
        let writer = {
            let (c, nid, acked) = (client.clone(), mds.nid.clone(), acked.clone());
            let start = next;
            tokio::spawn(async move {
                let mut v = start;
                while checkpoint(&c, &nid, v).await.is_ok() {
                    acked.store(v, Ordering::SeqCst);
                    v += 1;
                }
                v
            })
        };
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Until one version is acknowledged, the kill waits for it: on a loaded machine a
        // whole round can pass before the first save (a connection, its handshake, four
        // durable changes), and a test that never acknowledged anything checks nothing.
        let first = tokio::time::Instant::now() + Duration::from_secs(20);
        while acked.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < first {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(5 + (seed >> 33) % 60)).await;
        mds.kill();
        next = writer.await.unwrap() + 1;
        mds = Server::start(
            "lode-mds",
            &["--data-dir", dir.to_str().unwrap(), "--listen", &addr],
        )
        .unwrap();

        let done = acked.load(Ordering::SeqCst);
        let got = call(
            &*client,
            &mds.nid,
            &MdsLookup {
                creds: Creds::root(),
                parent: ROOT,
                name: b"ckpt".to_vec(),
                lease: None,
            },
            T,
        )
        .await;
        match got {
            Ok(found) => {
                let v: u64 = String::from_utf8(found.inode.xattrs["user.version"].clone())
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(
                    found.inode.size,
                    v * 1000,
                    "round {round}: version {v} is whole"
                );
                assert!(
                    v >= done,
                    "round {round}: acknowledged version {done} lost (found {v})"
                );
            }
            Err(e) => assert_eq!(
                done, 0,
                "round {round}: the checkpoint vanished after {done} versions: {e}"
            ),
        }
    }
    assert!(
        acked.load(Ordering::SeqCst) > 0,
        "no checkpoint was ever acknowledged"
    );
    mds.kill();
    let (ok, out, err) = run("lode-mds", &["fsck", "--data-dir", dir.to_str().unwrap()]);
    // Temporary files of interrupted checkpoints are ordinary files; everything else is clean.
    assert!(ok, "{out}{err}");
    std::fs::remove_dir_all(&root).unwrap();
}
