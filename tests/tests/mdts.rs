//! Several metadata targets over the same storage servers: each MDT numbers its inodes and
//! precreates its objects in sequences of its own, so a FID names its MDT, no two MDTs ever
//! hand out one object, and an MDT started on a directory formatted anew (the operator's slip
//! that once destroyed a whole storage server's objects) cleans up only its own sequence.
//!
//! The cluster: MDT0 and MDT1, each on its own MDS, and two storage servers registered with
//! both, on loopback with authentication on. MDT0's files go through the client library; MDT1
//! is spoken to over the wire, under its own root, as clients do not reach it yet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError};
use oss::engine::mem::MemEngine;
use proto::fid::{mdt_of, mdt_root, object_seq};
use proto::md::*;
use proto::{Nid, StatusCode};

const T: Duration = Duration::from_secs(10);

fn data(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i * 13 % 251) as u8))
        .collect()
}

/// Creates `name` under MDT1's root over the raw protocol, striped over both targets,
/// retrying while MDT1's pools are still filling (ENOSPC); returns the new inode.
async fn create_on_mdt1(raw: &TcpEndpoint, mdt1: &Nid, name: &str, req: u64) -> Inode {
    let layout = client::raid0(Some(2), 1 << 20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = MdsReint {
            creds: Creds::root(),
            mutation: Mutation::Create {
                parent: mdt_root(1),
                name: name.as_bytes().to_vec(),
                kind: Kind::File,
                mode: 0o644,
                exclusive: true,
                target: vec![],
                layout: Some(layout.clone()),
            },
            req: None,
            acked: 0,
            open: None,
            size_gen: None,
            behind: false,
            lease: false,
            time: None,
        };
        match call(raw, mdt1, &r, T).await {
            Ok(reply) => return reply.inode.expect("a create returns its inode"),
            Err(NetError::Remote { err, .. })
                if err.code == StatusCode::NoSpace && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
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
    let dir = std::env::temp_dir().join(format!("lode-mdts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut c: Cluster = ClusterBuilder::new(Network::Loopback, &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50))
        .mdts(2)
        .start()
        .await
        .unwrap();
    let admin = c
        .client(
            "admin",
            ClientConfig {
                creds: Creds::root(),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    c.wait_ready(&admin, 2, Duration::from_secs(20))
        .await
        .unwrap();

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
