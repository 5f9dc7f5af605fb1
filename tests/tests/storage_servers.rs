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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_register_and_acknowledged_writes_survive_kill_9() {
    let root = scratch("servers");
    let mds = mds(&root.join("mds"));
    let oss_dir = root.join("oss0");
    let server = oss(&oss_dir, &mds, "127.0.0.1:0", "2").unwrap();
    let oss_nid = server.nid.clone();

    let client = TcpEndpoint::client(TcpConfig::default());
    let listed = call(&client, &mds.nid, &ListTargets {}, T).await.unwrap();
    let indices: Vec<u32> = listed.targets.iter().map(|t| t.index).collect();
    assert_eq!(indices, vec![0, 1]);
    assert!(listed
        .targets
        .iter()
        .all(|t| t.oss == oss_nid && t.up && t.total > 0));

    // A synced write, then a write followed by a sync: both acknowledged as durable.
    let fid = call(
        &client,
        &oss_nid,
        &OstPrecreate {
            target: 1,
            count: 2,
        },
        T,
    )
    .await
    .unwrap()
    .first;
    let data: Vec<u8> = (0..(3 << 20) + 123)
        .map(|i: u32| (i * 31 % 256) as u8)
        .collect();
    let src = client.register(data.clone()).unwrap();
    let desc = src.desc(0, data.len() as u32, true).unwrap();
    call(
        &client,
        &oss_nid,
        &OstWrite {
            target: 1,
            fid,
            offset: 0,
            desc: desc.clone(),
            sync: true,
        },
        T,
    )
    .await
    .unwrap();
    let fid2 = proto::Fid::new(fid.seq, fid.oid + 1, 0);
    call(
        &client,
        &oss_nid,
        &OstWrite {
            target: 1,
            fid: fid2,
            offset: 4096,
            desc,
            sync: false,
        },
        T,
    )
    .await
    .unwrap();
    call(
        &client,
        &oss_nid,
        &OstSync {
            target: 1,
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
        &OstGetattr { target: 1, fid },
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
    for (f, off) in [(fid, 0u64), (fid2, 4096)] {
        let read = OstRead {
            target: 1,
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
    let client = TcpEndpoint::client(TcpConfig::default());
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
