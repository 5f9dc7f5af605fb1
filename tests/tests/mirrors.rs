//! Mirrored files on real processes: an MDS and four storage servers, one killed with
//! `kill -9` under a streaming read and under a checkpoint write, then restarted and its copy
//! resynced in the background; a damaged block repaired from the other copy; a wiped target
//! rebuilt; a copy added to a file.

use std::time::{Duration, Instant};

use client::{Client, ClientConfig, OpenOptions};
use lode_tests::{mds_of, scratch, Server};
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
    let Cluster {
        root,
        mds,
        mut servers,
        client: c,
    } = Cluster::start("mirrors").await;
    let targets: Vec<(u32, Nid)> = c
        .targets()
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.index, t.oss))
        .collect();
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

    // The server returns; the MDS's healer resyncs its copy in the background, identical.
    servers[victim] = Some(oss(
        &root.join(format!("oss{victim}")),
        &mds.nid,
        &victim_addr,
    ));
    let back = Instant::now();
    loop {
        let l = c.getstripe("/ckpt").await.unwrap().unwrap();
        if l.stale_mirrors().is_empty() {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(60),
            "the stale copy was not resynced in the background"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "resync: in sync {:?} after the server returned",
        back.elapsed()
    );
    let f = OpenOptions::new()
        .read(true)
        .open(&c, "/ckpt")
        .await
        .unwrap();
    let len = ckpt.len() as u64;
    assert!(f.read_copy(0, 0, len).await.unwrap() == ckpt);
    assert!(f.read_copy(1, 0, len).await.unwrap() == ckpt);
    f.close().await.unwrap();
}

/// An MDS and four storage servers (one target each), every target in service.
struct Cluster {
    root: std::path::PathBuf,
    mds: Server,
    servers: Vec<Option<Server>>,
    client: Client,
}

impl Cluster {
    async fn start(name: &str) -> Cluster {
        let root = scratch(name);
        let mds = mds_of(&root);
        let servers: Vec<Option<Server>> = (0..4)
            .map(|i| Some(oss(&root.join(format!("oss{i}")), &mds.nid, "127.0.0.1:0")))
            .collect();
        let cfg = ClientConfig {
            security: Some(lode_tests::client_security()),
            retry_for: Duration::from_secs(20),
            ..Default::default()
        };
        let client = Client::connect_with(&mds.nid.to_string(), cfg)
            .await
            .unwrap();
        let start = Instant::now();
        loop {
            let t = client.targets().await.unwrap();
            let probe = OpenOptions::new()
                .write(true)
                .create(true)
                .open(&client, "/probe")
                .await;
            // Up is not enough: a target takes stripes once its precreated objects are in,
            // and a mirrored file needs all four.
            if t.len() == 4 && t.iter().all(|t| t.up && t.takes_stripes) && probe.is_ok() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "targets never came up"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Cluster {
            root,
            mds,
            servers,
            client,
        }
    }

    /// The index of the server (in `servers`) holding `target`.
    async fn server_holding(&self, target: u32) -> usize {
        let t = self.client.targets().await.unwrap();
        let nid = &t.iter().find(|x| x.index == target).unwrap().oss;
        self.servers
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.nid == *nid))
            .unwrap()
    }
}

/// The data file of object `fid` in the data directory of a storage server.
fn object_file(dir: &std::path::Path, fid: proto::Fid) -> std::path::PathBuf {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e
            .unwrap()
            .path()
            .join("O")
            .join(format!("{:x}", fid.seq))
            .join(format!("d{}", fid.oid % 32))
            .join(format!("{:x}", fid.oid));
        if p.exists() {
            return p;
        }
    }
    panic!("no data file for {fid} in {}", dir.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_failing_its_checksum_is_read_from_the_other_copy_and_repaired() {
    let cl = Cluster::start("mirror-bitflip").await;
    let c = &cl.client;
    let data = pattern(3, 8 << 20);
    write_file(c, "/flip", &data).await;
    let layout = c.getstripe("/flip").await.unwrap().unwrap();
    // Damage mirror 1 where the second stripe unit lives: reads spread stripe units over the
    // copies, and that unit is read from mirror 1.
    let copy = layout.mirror(1);
    let p = copy.pieces((1 << 20) + 100, 1).unwrap()[0];
    let obj = copy.components[p.component].objects[p.stripe as usize];
    let server = cl.server_holding(obj.target).await;
    let path = object_file(&cl.root.join(format!("oss{server}")), obj.fid);
    let mut raw = std::fs::read(&path).unwrap();
    let at = p.object_offset as usize;
    let good = raw[at];
    raw[at] ^= 0x10;
    std::fs::write(&path, &raw).unwrap();

    let f = OpenOptions::new()
        .read(true)
        .open(c, "/flip")
        .await
        .unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(f.read_at(0, &mut back).await.unwrap(), data.len());
    assert!(back == data, "a read over a damaged block differs");
    // Repaired on disk: the damaged copy reads whole on its own, and the byte is back.
    let len = data.len() as u64;
    assert!(f.read_copy(1, 0, len).await.unwrap() == data);
    f.close().await.unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap()[at],
        good,
        "the damaged byte was not rewritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_target_is_rebuilt_and_a_copy_can_be_added() {
    let mut cl = Cluster::start("mirror-rebuild").await;
    let data = pattern(4, 12 << 20);
    write_file(&cl.client, "/w", &data).await;
    let layout = cl.client.getstripe("/w").await.unwrap().unwrap();
    // Mirror 0's: placing a file's first copy anew puts it after the kept one while it is
    // placed (an MDS once lost count of the copies there and panicked).
    let lost_target = layout.mirror(0).components[0].objects[0].target;
    let s = cl.server_holding(lost_target).await;
    let dir = cl.root.join(format!("oss{s}"));
    let listen = addr(&cl.servers[s].as_ref().unwrap().nid);

    // The server's disk is wiped while it is down: it comes back with a new, empty target.
    cl.servers[s].take().unwrap().kill();
    std::fs::remove_dir_all(&dir).unwrap();
    cl.servers[s] = Some(oss(&dir, &cl.mds.nid, &listen));
    let c = &cl.client;
    let start = Instant::now();
    let taking = |t: &&proto::registry::TargetInfo| t.up && t.takes_stripes;
    while c.targets().await.unwrap().iter().filter(taking).count() < 4 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the new target never came up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Still readable from the other copy meanwhile.
    let f = OpenOptions::new().read(true).open(c, "/w").await.unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_at(0, &mut back).await.unwrap();
    assert!(back == data, "a read with a wiped copy differs");
    f.close().await.unwrap();

    let report = client::mirrors::rebuild_target(c, lost_target, |_, _, _| {})
        .await
        .unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.rebuilt, 1);
    assert_eq!(report.bytes, data.len() as u64);
    let rebuilt = c.getstripe("/w").await.unwrap().unwrap();
    assert!(rebuilt.stale_mirrors().is_empty());
    assert!(
        rebuilt
            .components
            .iter()
            .flat_map(|c| &c.objects)
            .all(|o| o.target != lost_target),
        "an object is still on the wiped target"
    );
    let f = OpenOptions::new().read(true).open(c, "/w").await.unwrap();
    let len = data.len() as u64;
    assert!(f.read_copy(0, 0, len).await.unwrap() == data);
    assert!(f.read_copy(1, 0, len).await.unwrap() == data);
    f.close().await.unwrap();

    // A file with one copy gets a second one, on other servers.
    let one = pattern(5, 5 << 20);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .layout(client::stripe_args::parse(&["-c", "2", "-S", "1M"].map(String::from)).unwrap())
        .open(c, "/one")
        .await
        .unwrap();
    f.write_at(0, &one).await.unwrap();
    f.fsync().await.unwrap();
    let copied = f.extend_mirror(|_, _| {}).await.unwrap();
    assert_eq!(copied, one.len() as u64);
    let l = c.getstripe("/one").await.unwrap().unwrap();
    assert_eq!(l.mirror_count(), 2);
    assert!(l.stale_mirrors().is_empty());
    let targets_of = |m: u16| -> Vec<u32> {
        l.mirror(m)
            .components
            .iter()
            .flat_map(|c| c.objects.iter().map(|o| o.target))
            .collect()
    };
    assert!(targets_of(0).iter().all(|t| !targets_of(1).contains(t)));
    assert!(f.read_copy(1, 0, one.len() as u64).await.unwrap() == one);
    f.close().await.unwrap();
}

/// A stale copy is declared in sync only by a resync that held the file alone from before it
/// copied: a writer open meanwhile wrote only the copies in sync, and the copy would lack its
/// acknowledged writes (readers would then alternate between copies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_is_not_declared_in_sync_while_another_handle_may_write_past_it() {
    let cl = Cluster::start("mirror-writer").await;
    let c = &cl.client;
    // Each node its own client: a handle closed stays open at the MDS a while (the open
    // cache), and counts as a writer's until its client lets it go.
    let client = || async {
        let cfg = ClientConfig {
            security: Some(lode_tests::client_security()),
            retry_for: Duration::from_secs(20),
            ..Default::default()
        };
        Client::connect_with(&cl.mds.nid.to_string(), cfg)
            .await
            .unwrap()
    };
    let data = pattern(6, 3 << 20);
    let first = client().await;
    write_file(&first, "/w", &data).await;
    first.close().await.unwrap();
    let l = c.getstripe("/w").await.unwrap().unwrap();
    let fid = c.stat("/w").await.unwrap().fid;
    c.reint(proto::md::Mutation::MirrorState {
        fid,
        mirror: 1,
        stale: true,
        generation: l.generation,
    })
    .await
    .unwrap();
    // Another node resyncs (as `lode mirror resync` does) while a third writes.
    let (r, w) = (client().await, client().await);
    let rw = OpenOptions::new().read(true).write(true);
    let resyncer = rw.open(&r, "/w").await.unwrap();
    let writer = rw.open(&w, "/w").await.unwrap();
    let err = resyncer.resync(|_, _| {}).await.unwrap_err();
    assert!(err.is(proto::FsErrorKind::WouldBlock), "{err}");
    let l = c.getstripe("/w").await.unwrap().unwrap();
    assert_eq!(
        l.stale_mirrors(),
        vec![1],
        "declared in sync under a writer"
    );
    // The writer writes (to the copy in sync only) and is gone: the resync that began before
    // its open still may not clear the copy.
    writer.write_at(0, b"late").await.unwrap();
    writer.close().await.unwrap();
    w.close().await.unwrap();
    assert!(resyncer.resync(|_, _| {}).await.is_err());
    resyncer.close().await.unwrap();
    r.close().await.unwrap();
    // A resync holding the file alone from its start clears it, with every write.
    let r = client().await;
    let alone = rw.open(&r, "/w").await.unwrap();
    alone.resync(|_, _| {}).await.unwrap();
    let mut want = data.clone();
    want[..4].copy_from_slice(b"late");
    let len = want.len() as u64;
    assert!(alone.read_copy(1, 0, len).await.unwrap() == want);
    assert!(c
        .getstripe("/w")
        .await
        .unwrap()
        .unwrap()
        .stale_mirrors()
        .is_empty());
    alone.close().await.unwrap();
    r.close().await.unwrap();
}
