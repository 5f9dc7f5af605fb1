//! Mirrored files on real processes: an MDS and four storage servers, one killed with
//! `kill -9` under a streaming read and under a checkpoint write, then restarted and its copy
//! resynced.

use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use lode_tests::{scratch, Server};
use proto::layout::Layout;
use proto::Nid;

fn oss(dir: &std::path::Path, mds: &Nid, listen: &str) -> Server {
    Server::start(
        "lode-oss",
        &[
            "--data-dir",
            dir.to_str().unwrap(),
            "--mds",
            &mds.to_string(),
            "--listen",
            listen,
            "--heartbeat",
            "1",
        ],
    )
    .unwrap()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i.wrapping_mul(0x9E37_79B9) >> 7) ^ seed) as u8)
        .collect()
}

/// The listen address of a server's NID (`127.0.0.1:PORT@tcp`), to restart it there.
fn addr(nid: &Nid) -> String {
    nid.to_string().trim_end_matches("@tcp").to_owned()
}

/// Which storage server (of `servers`, by NID) holds the first object of `mirror`.
fn server_of(layout: &Layout, mirror: u16, targets: &[(u32, Nid)]) -> Nid {
    let t = layout.mirror(mirror).components[0].objects[0].target;
    targets.iter().find(|(i, _)| *i == t).unwrap().1.clone()
}

/// Two copies, each over two servers, 1 MiB stripes.
fn two_copies() -> Layout {
    client::stripe_args::parse(&["-N", "2", "-c", "2", "-S", "1M"].map(String::from)).unwrap()
}

async fn write_file(c: &Client, path: &str, data: &[u8]) {
    let l = two_copies();
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .layout(l)
        .open(c, path)
        .await
        .unwrap();
    f.write_at(0, data).await.unwrap();
    f.fsync().await.unwrap();
    f.close().await.unwrap();
}

// Long by design: one cluster through a read and a write that each lose a server, a restart
// and a resync, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrored_files_keep_working_through_a_lost_server_and_resync() {
    let root = scratch("mirrors");
    let mds = Server::start(
        "lode-mds",
        &[
            "--data-dir",
            root.join("mds").to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .unwrap();
    let mut servers: Vec<Option<Server>> = (0..4)
        .map(|i| Some(oss(&root.join(format!("oss{i}")), &mds.nid, "127.0.0.1:0")))
        .collect();
    let cfg = ClientConfig {
        security: Some(lode_tests::client_security()),
        retry_for: Duration::from_secs(20),
        ..Default::default()
    };
    let c = Client::connect_with(&mds.nid.to_string(), cfg)
        .await
        .unwrap();
    // Every target in service: a mirrored create then finds four servers.
    let start = Instant::now();
    let targets = loop {
        let t = c.targets().await.unwrap();
        let probe = OpenOptions::new()
            .write(true)
            .create(true)
            .open(&c, "/probe")
            .await;
        if t.len() == 4 && t.iter().all(|t| t.up) && probe.is_ok() {
            break t.into_iter().map(|t| (t.index, t.oss)).collect::<Vec<_>>();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "targets never came up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let which = |servers: &[Option<Server>], nid: &Nid| {
        servers
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.nid == *nid))
            .unwrap()
    };

    // Two copies on distinct servers.
    let shard = pattern(1, 24 << 20);
    write_file(&c, "/shard", &shard).await;
    let layout = c.getstripe("/shard").await.unwrap().unwrap();
    assert_eq!(layout.mirror_count(), 2);
    let servers_of = |m: u16| -> Vec<Nid> {
        layout
            .mirror(m)
            .components
            .iter()
            .flat_map(|c| &c.objects)
            .map(|o| {
                targets
                    .iter()
                    .find(|(i, _)| *i == o.target)
                    .unwrap()
                    .1
                    .clone()
            })
            .collect()
    };
    assert!(
        servers_of(0).iter().all(|s| !servers_of(1).contains(s)),
        "a server holds both copies"
    );

    // A streaming read loses a server holding one copy: it goes on from the other.
    let f = OpenOptions::new()
        .read(true)
        .open(&c, "/shard")
        .await
        .unwrap();
    let mut got = vec![0u8; 4 << 20];
    f.read_at(0, &mut got).await.unwrap();
    let lost = which(&servers, &server_of(&layout, 0, &targets));
    let lost_addr = addr(&servers[lost].as_ref().unwrap().nid);
    servers[lost].take().unwrap().kill();
    let killed = Instant::now();
    let mut first = None;
    let mut at = 4 << 20;
    while at < shard.len() {
        let mut buf = vec![0u8; 1 << 20];
        let n = f.read_at(at as u64, &mut buf).await.unwrap();
        first.get_or_insert(killed.elapsed());
        got.extend_from_slice(&buf[..n]);
        at += n;
    }
    let after_kill = killed.elapsed();
    assert!(got == shard, "a read through a lost server differs");
    assert!(
        after_kill < Duration::from_secs(15),
        "the read took {after_kill:?} after the kill"
    );
    eprintln!(
        "read: first byte {:?} after the kill, done {after_kill:?}",
        first.unwrap()
    );
    f.close().await.unwrap();

    // The server comes back on its address; a checkpoint write loses another one.
    servers[lost] = Some(oss(&root.join(format!("oss{lost}")), &mds.nid, &lost_addr));
    let ckpt = pattern(2, 24 << 20);
    let l = two_copies();
    let w = OpenOptions::new()
        .write(true)
        .create(true)
        .layout(l)
        .open(&c, "/ckpt.tmp")
        .await
        .unwrap();
    let wl = c.getstripe("/ckpt.tmp").await.unwrap().unwrap();
    let victim = which(&servers, &server_of(&wl, 1, &targets));
    let victim_addr = addr(&servers[victim].as_ref().unwrap().nid);
    let mut killed = None;
    for (k, piece) in ckpt.chunks(1 << 20).enumerate() {
        if k == 8 {
            servers[victim].take().unwrap().kill();
            killed = Some(Instant::now());
        }
        w.write_at((k << 20) as u64, piece).await.unwrap();
    }
    w.fsync().await.unwrap();
    w.close().await.unwrap();
    c.rename("/ckpt.tmp", "/ckpt").await.unwrap();
    let took = killed.unwrap().elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the checkpoint took {took:?} after the kill"
    );
    eprintln!("write: done {took:?} after the kill");
    let after = c.getstripe("/ckpt").await.unwrap().unwrap();
    assert_eq!(
        after.stale_mirrors(),
        vec![1],
        "the lost copy is marked stale"
    );
    assert!(after.generation > wl.generation);
    let r = OpenOptions::new()
        .read(true)
        .open(&c, "/ckpt")
        .await
        .unwrap();
    let mut back = vec![0u8; ckpt.len()];
    assert_eq!(r.read_at(0, &mut back).await.unwrap(), ckpt.len());
    assert!(back == ckpt, "the checkpoint read back differs");
    r.close().await.unwrap();

    // The server returns; the resync brings its copy back, identical.
    servers[victim] = Some(oss(
        &root.join(format!("oss{victim}")),
        &mds.nid,
        &victim_addr,
    ));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&c, "/ckpt")
        .await
        .unwrap();
    let copied = f.resync(|_, _| {}).await.unwrap();
    assert_eq!(copied, ckpt.len() as u64);
    let synced = c.getstripe("/ckpt").await.unwrap().unwrap();
    assert!(
        synced.stale_mirrors().is_empty(),
        "still stale after the resync"
    );
    let len = ckpt.len() as u64;
    assert!(f.read_copy(0, 0, len).await.unwrap() == ckpt);
    assert!(f.read_copy(1, 0, len).await.unwrap() == ckpt);
    f.close().await.unwrap();
}
