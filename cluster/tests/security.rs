//! Who gets in, and as whom: a client without the cluster's key is refused by the MDS and by
//! every storage server; root on a node the MDS does not trust is squashed to nobody; the
//! capabilities of a long-running open renew by themselves.

use std::sync::Arc;
use std::time::Duration;

use client::{Client, ClientConfig, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::auth::{KeyFile, Keyring, Security};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError};
use mds::identity::{Nodemap, NOBODY};
use oss::engine::mem::MemEngine;
use proto::md::Creds;
use proto::FsErrorKind;

const T: Duration = Duration::from_secs(10);

async fn cluster(name: &str, builder: impl FnOnce(ClusterBuilder) -> ClusterBuilder) -> Cluster {
    let dir = std::env::temp_dir().join(format!("lode-sec-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let b = ClusterBuilder::new(Network::Loopback, &dir)
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .storage_server(vec![Arc::new(MemEngine::new(1 << 30))])
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50));
    builder(b).start().await.unwrap()
}

/// A client holding the cluster key: an administrator, whom no nodemap squashes.
async fn admin(c: &Cluster) -> Client {
    let net = TcpEndpoint::client(TcpConfig {
        security: c.server_security(),
        ..TcpConfig::default()
    });
    let cfg = ClientConfig {
        creds: Creds::root(),
        ..ClientConfig::default()
    };
    let admin = Client::connect_on(net.into(), &c.mds().nid().to_string(), cfg)
        .await
        .unwrap();
    c.wait_ready(&admin, 2, Duration::from_secs(20))
        .await
        .unwrap();
    admin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_key_is_refused_by_the_mds_and_every_storage_server() {
    let c = cluster("nokey", |b| b).await;
    let _admin = admin(&c).await;
    let mut servers = vec![c.mds().nid()];
    for i in 0..c.storage_servers() {
        servers.push(c.oss(i).unwrap().nid());
    }
    let stranger = Security::client(Arc::new(Keyring::new(&KeyFile::generate().unwrap())), false);
    for security in [Security::Off, stranger.clone()] {
        let ep = TcpEndpoint::client(TcpConfig {
            security,
            ..TcpConfig::default()
        });
        for nid in &servers {
            let err = call(&ep, nid, &proto::msg::Ping { nonce: 1 }, T)
                .await
                .unwrap_err();
            assert!(matches!(err, NetError::Refused { .. }), "{nid}: {err}");
        }
    }
    // Through the client library: a clear error, at once (no retrying for a minute).
    let cfg = ClientConfig {
        security: Some(stranger),
        ..ClientConfig::default()
    };
    let started = std::time::Instant::now();
    let err = Client::connect_with(&c.mds().nid().to_string(), cfg)
        .await
        .err()
        .expect("a client with another cluster's key got in");
    assert!(err.is(FsErrorKind::AccessDenied), "{err}");
    assert!(started.elapsed() < T);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_on_an_untrusted_node_is_squashed_to_nobody() {
    // Nothing trusted: this machine is an ordinary client node.
    let c = cluster("squash", |b| b.nodemap(Nodemap::default())).await;
    let admin = admin(&c).await;
    admin.mkdir("/shared", 0o777).await.unwrap();
    let user = admin.as_user(Creds {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    });
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .open(&user, "/shared/private")
        .await
        .unwrap();
    f.write_at(0, b"the weights").await.unwrap();
    f.close().await.unwrap();

    let root = c
        .client(
            "root",
            ClientConfig {
                creds: Creds::root(),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    // Root cannot read another user's private file...
    let err = OpenOptions::new()
        .read(true)
        .open(&root, "/shared/private")
        .await
        .expect_err("squashed root opened a 0600 file of another user");
    assert!(err.is(FsErrorKind::AccessDenied), "{err}");
    // ...nor create where only root may...
    let err = root.mkdir("/rootdir", 0o755).await.unwrap_err();
    assert!(err.is(FsErrorKind::AccessDenied), "{err}");
    // ...and what it creates is nobody's.
    let mine = OpenOptions::new()
        .write(true)
        .create(true)
        .open(&root, "/shared/by-root")
        .await
        .unwrap();
    mine.write_at(0, b"x").await.unwrap();
    // A truncate through its own handle works without permission checks on root's behalf.
    mine.set_len(0).await.unwrap();
    mine.close().await.unwrap();
    let st = admin.stat("/shared/by-root").await.unwrap();
    assert_eq!((st.uid, st.gid), (NOBODY, NOBODY));
    // The owner reads its file as ever.
    let g = OpenOptions::new()
        .read(true)
        .open(&user, "/shared/private")
        .await
        .unwrap();
    let mut buf = [0u8; 11];
    g.read_at(0, &mut buf).await.unwrap();
    assert_eq!(&buf, b"the weights");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_of_a_long_open_renew_by_themselves() {
    let c = cluster("renew", |b| b.capability_lifetime(Duration::from_secs(2))).await;
    let _admin = admin(&c).await;
    let client = c
        .client(
            "renewer",
            ClientConfig {
                creds: Creds::root(),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .stripe_all()
        .open(&client, "/long")
        .await
        .unwrap();
    let data = vec![7u8; 3 << 20];
    for round in 0..3u64 {
        f.write_at(round * data.len() as u64, &data).await.unwrap();
        // Past the lifetime of the capabilities the open came with.
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    f.fsync().await.unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_at(2 * data.len() as u64, &mut back).await.unwrap();
    assert_eq!(back, data);
    f.close().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_says_who_opened_replaced_and_removed_a_checkpoint() {
    let log = std::env::temp_dir().join(format!("lode-audit-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let cfg = mds::audit::AuditConfig {
        max_bytes: 1 << 20,
        keep: 2,
        ..mds::audit::AuditConfig::new(&log)
    };
    let c = cluster("audit", |b| b.audit(cfg)).await;
    let _admin = admin(&c).await;
    let user = c
        .client(
            "trainer",
            ClientConfig {
                creds: Creds {
                    uid: 0,
                    gid: 0,
                    groups: vec![],
                },
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap();
    user.mkdir("/ckpt", 0o755).await.unwrap();
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .open(&user, "/ckpt/step-1.tmp")
        .await
        .unwrap();
    f.write_at(0, b"weights").await.unwrap();
    f.close().await.unwrap();
    user.rename("/ckpt/step-1.tmp", "/ckpt/step-1")
        .await
        .unwrap();
    let r = OpenOptions::new()
        .read(true)
        .open(&user, "/ckpt/step-1")
        .await
        .unwrap();
    r.close().await.unwrap();
    user.unlink("/ckpt/step-1").await.unwrap();
    // The unlink may have been answered ahead: it reaches the MDS before the servers stop.
    user.sync().await.unwrap();
    c.stop().await;
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let find = |op: &str, path: &str| {
        lines
            .iter()
            .find(|l| l["op"] == op && l["path"] == path)
            .unwrap_or_else(|| panic!("no {op} of {path} in {lines:#?}"))
    };
    let created = find("create", "/ckpt/step-1.tmp");
    assert_eq!(created["result"], "ok");
    assert_eq!(created["role"], "client");
    assert_eq!(created["uid"], 0);
    assert!(created["node"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(created["fid"].as_str().is_some());
    assert_eq!(find("mkdir", "/ckpt")["result"], "ok");
    assert_eq!(find("rename", "/ckpt/step-1.tmp")["to"], "/ckpt/step-1");
    let opened = find("open", "/ckpt/step-1");
    assert_eq!(opened["detail"], "granted read+write");
    assert_eq!(opened["fid"], created["fid"]);
    assert_eq!(find("unlink", "/ckpt/step-1")["fid"], created["fid"]);
    let _ = std::fs::remove_file(&log);
}
