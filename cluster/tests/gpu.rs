//! Files read into and written from GPU memory, on the simulated fabric and the simulated GPU
//! (whose device memory faults on any CPU access): byte-exact data on both paths with several
//! storage servers writing disjoint stripes into one buffer at once, no host staging on the
//! direct path, fallback and refusal when the NIC cannot register the buffer, and checksum
//! errors that name the object and the offset.

use std::sync::Arc;
use std::time::Duration;

use client::gpu::sim::SimGpu;
use client::gpu::{DeviceIo, Gpu, GpuError, IoPath, PathTaken, Verified};
use client::{Client, ClientConfig, ClientError, OpenOptions};
use cluster::{Cluster, ClusterBuilder, Network};
use lnet::sim::{BulkFaults, Fabric, LinkParams};
use oss::engine::mem::MemEngine;

const SERVERS: usize = 4;
const STRIPE: u64 = 64 << 10;

struct Setup {
    cluster: Cluster,
    fabric: Fabric,
    engines: Vec<Arc<MemEngine>>,
    gpu: SimGpu,
    client: Client,
    dir: std::path::PathBuf,
}

async fn setup(name: &str, seed: u64) -> Setup {
    let dir = std::env::temp_dir().join(format!("lode-gpu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fabric = Fabric::new(seed);
    // Seeded delays and reordering: the servers' puts land in any order.
    fabric
        .set_default_link(LinkParams {
            latency: Duration::from_micros(200),
            reorder: 0.3,
            reorder_window: Duration::from_millis(2),
            ..LinkParams::default()
        })
        .unwrap();
    let engines: Vec<Arc<MemEngine>> = (0..SERVERS)
        .map(|_| Arc::new(MemEngine::new(1 << 30)))
        .collect();
    let mut b = ClusterBuilder::new(Network::Fabric(fabric.clone()), &dir)
        .heartbeat(Duration::from_millis(100), Duration::from_secs(2))
        .maintain_every(Duration::from_millis(50));
    for e in &engines {
        b = b.storage_server(vec![e.clone()]);
    }
    let cluster = b.start().await.unwrap();
    let gpu = SimGpu::new(64 << 20, 0).unwrap();
    let cfg = ClientConfig {
        creds: proto::md::Creds::root(),
        gpu: Some(Gpu(Arc::new(gpu.clone()))),
        staging_chunk: 192 << 10,
        staging_chunks: 3,
        ..ClientConfig::default()
    };
    let client = cluster.client("client", cfg).await.unwrap();
    cluster
        .wait_ready(&client, SERVERS as u32, Duration::from_secs(20))
        .await
        .unwrap();
    Setup {
        cluster,
        fabric,
        engines,
        gpu,
        client,
        dir,
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A file striped over every server, with a tail that is not a whole stripe.
async fn striped_file(s: &Setup, path: &str, len: usize) -> Vec<u8> {
    let data = pattern(len as u64, len);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .stripe_count(SERVERS as u32)
        .stripe_size(STRIPE)
        .open(&s.client, path)
        .await
        .unwrap();
    f.write_at(0, &data).await.unwrap();
    f.close().await.unwrap();
    data
}

async fn open(s: &Setup, path: &str) -> client::File {
    OpenOptions::new()
        .read(true)
        .open(&s.client, path)
        .await
        .unwrap()
}

fn io(path: IoPath) -> DeviceIo {
    DeviceIo { path, stream: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_and_staged_reads_land_byte_exact_in_device_memory() {
    let s = setup("exact", 21).await;
    let len = 2_000_000;
    let data = striped_file(&s, "/shard", len).await;
    let f = open(&s, "/shard").await;

    // Direct: four servers put their stripes straight into one device buffer, at once.
    let dev = s.gpu.alloc(len as u64 + 100).unwrap();
    let done = f
        .read_device(0, &dev.buf(), 0, len as u64, io(IoPath::Direct))
        .await
        .unwrap();
    assert_eq!(done.bytes, len as u64);
    assert_eq!(done.path, PathTaken::Direct);
    assert_eq!(done.verified, Verified::ServerOnly);
    assert_eq!(done.staged_bytes, 0);
    assert_eq!(
        s.client.staged_bytes(),
        0,
        "no byte went through host staging"
    );
    assert_eq!(s.gpu.copied_to_device(), 0, "no host-to-device copy ran");
    assert!(s.gpu.dma_bytes() >= len as u64);
    let back = s.gpu.read_back(&dev.buf()).unwrap();
    assert!(back[..len] == data[..], "direct read differs");
    assert!(
        back[len..].iter().all(|&b| b == 0xee),
        "bytes past the read were written"
    );

    // Auto on a fabric that reaches device memory goes direct too.
    let done = f
        .read_device(0, &dev.buf(), 0, len as u64, io(IoPath::Auto))
        .await
        .unwrap();
    assert_eq!((done.path, done.fallback), (PathTaken::Direct, None));

    // Staged: an unaligned range of the file into an unaligned place in the buffer, through a
    // ring of three chunks.
    let (at, n, into) = (77_777u64, 1_500_001u64, 333u64);
    let dev2 = s.gpu.alloc(n + into).unwrap();
    let done = f
        .read_device(at, &dev2.buf(), into, n, io(IoPath::Staged))
        .await
        .unwrap();
    assert_eq!(done.path, PathTaken::Staged);
    assert_eq!(done.verified, Verified::EndToEnd);
    assert_eq!((done.bytes, done.staged_bytes), (n, n));
    assert_eq!(s.client.staged_bytes(), n);
    assert_eq!(s.gpu.copied_to_device(), n);
    let back = s.gpu.read_back(&dev2.buf()).unwrap();
    assert!(back[into as usize..] == data[at as usize..(at + n) as usize]);
    assert!(back[..into as usize].iter().all(|&b| b == 0xee));

    // A read past the end is short, on both paths.
    for path in [IoPath::Direct, IoPath::Staged] {
        let done = f
            .read_device(len as u64 - 10, &dev.buf(), 0, 1000, io(path))
            .await
            .unwrap();
        assert_eq!(done.bytes, 10);
    }
    // A range outside the device buffer is refused before anything moves.
    let err = f
        .read_device(0, &dev2.buf(), 1, dev2.buf().len, io(IoPath::Staged))
        .await
        .unwrap_err();
    assert!(err.is(proto::FsErrorKind::Invalid), "{err}");
    s.cluster.stop().await;
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_failure_falls_back_under_auto_and_fails_under_direct() {
    let s = setup("fallback", 22).await;
    let len = 700_000;
    let data = striped_file(&s, "/f", len).await;
    let f = open(&s, "/f").await;
    s.fabric.refuse_device_registrations("client", true);
    let dev = s.gpu.alloc(len as u64).unwrap();
    let done = f
        .read_device(0, &dev.buf(), 0, len as u64, io(IoPath::Auto))
        .await
        .unwrap();
    assert_eq!(done.path, PathTaken::Staged);
    assert_eq!(done.verified, Verified::EndToEnd);
    let why = done.fallback.expect("the completion says why it staged");
    assert!(why.contains("refused to register"), "{why}");
    assert!(s.gpu.read_back(&dev.buf()).unwrap() == data);
    assert_eq!(s.gpu.dma_bytes(), 0);

    let err = f
        .read_device(0, &dev.buf(), 0, len as u64, io(IoPath::Direct))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Gpu(GpuError::DirectUnavailable(_))),
        "{err}"
    );
    assert!(err.is(proto::FsErrorKind::NotSupported));
    s.cluster.stop().await;
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checksum_mismatch_on_either_path_is_an_error_naming_the_object_and_offset() {
    let s = setup("checksum", 23).await;
    let len = 600_000;
    striped_file(&s, "/f", len).await;
    let f = open(&s, "/f").await;
    let dev = s.gpu.alloc(len as u64).unwrap();

    // Staged: a byte changed on the way, past every transport check, is caught in the
    // staging chunk (after one more try).
    s.fabric
        .set_bulk_faults(BulkFaults {
            corrupt: 1.0,
            ..BulkFaults::default()
        })
        .unwrap();
    let err = f
        .read_device(0, &dev.buf(), 0, len as u64, io(IoPath::Staged))
        .await
        .unwrap_err();
    match &err {
        ClientError::Checksum { fid, .. } => {
            let msg = err.to_string();
            assert!(
                msg.contains(&fid.to_string()) && msg.contains("object offset"),
                "{msg}"
            );
        }
        other => panic!("expected a checksum error, got {other}"),
    }
    s.fabric.set_bulk_faults(BulkFaults::default()).unwrap();

    // Direct: a bit flipped on a server's disk is refused by the server before sending.
    let obj = f.inode().layout.unwrap().components[0].objects[1];
    let root = s.dir.join(format!("oss{}/ost-0", obj.target));
    let rel = format!(
        "O/{:x}/d{}/{:x}",
        obj.fid.seq,
        obj.fid.oid % 32,
        obj.fid.oid
    );
    let engine = &s.engines[obj.target as usize];
    let flipped = engine.with_file(&root.join(&rel), |raw| {
        raw[100] ^= 0x10;
    });
    assert!(
        flipped.is_some(),
        "object file {rel} not found on target {}",
        obj.target
    );
    let err = f
        .read_device(0, &dev.buf(), 0, len as u64, io(IoPath::Direct))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("checksum") && msg.contains(&obj.fid.to_string()),
        "{msg}"
    );
    s.cluster.stop().await;
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_that_break_off_fail_the_read_and_never_leave_it_silently_wrong() {
    let s = setup("breakoff", 24).await;
    let len = 900_000;
    let data = striped_file(&s, "/f", len).await;
    let f = open(&s, "/f").await;
    let dev = s.gpu.alloc(len as u64).unwrap();
    s.fabric
        .set_bulk_faults(BulkFaults {
            break_off: 0.2,
            ..BulkFaults::default()
        })
        .unwrap();
    let (mut ok, mut failed) = (0, 0);
    for round in 0..12 {
        let path = if round % 2 == 0 {
            IoPath::Direct
        } else {
            IoPath::Staged
        };
        s.gpu.fill(&dev.buf(), &vec![0xee; len]).unwrap();
        match f.read_device(0, &dev.buf(), 0, len as u64, io(path)).await {
            Ok(done) => {
                assert_eq!(done.bytes, len as u64);
                assert!(
                    s.gpu.read_back(&dev.buf()).unwrap() == data,
                    "round {round}"
                );
                ok += 1;
            }
            Err(_) => failed += 1,
        }
    }
    assert!(failed > 0, "no transfer broke off in 12 rounds");
    s.fabric.set_bulk_faults(BulkFaults::default()).unwrap();
    let done = f
        .read_device(0, &dev.buf(), 0, len as u64, io(IoPath::Direct))
        .await
        .unwrap();
    assert_eq!(done.bytes, len as u64);
    assert!(s.gpu.read_back(&dev.buf()).unwrap() == data);
    let _ = ok;
    s.cluster.stop().await;
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_memory_is_written_to_a_file_on_both_paths() {
    let s = setup("write", 25).await;
    let len = 1_234_567usize;
    for (i, path) in [IoPath::Direct, IoPath::Staged].into_iter().enumerate() {
        let data = pattern(i as u64 + 9, len);
        let dev = s.gpu.alloc(len as u64).unwrap();
        s.gpu.fill(&dev.buf(), &data).unwrap();
        let name = format!("/out{i}");
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .stripe_count(SERVERS as u32)
            .stripe_size(STRIPE)
            .open(&s.client, &name)
            .await
            .unwrap();
        let done = f
            .write_device(0, &dev.buf(), 0, len as u64, io(path))
            .await
            .unwrap();
        match path {
            IoPath::Direct => assert_eq!(
                (done.path, done.verified, done.staged_bytes),
                (PathTaken::Direct, Verified::ServerOnly, 0)
            ),
            _ => assert_eq!(
                (done.path, done.verified, done.staged_bytes),
                (PathTaken::Staged, Verified::EndToEnd, len as u64)
            ),
        }
        f.close().await.unwrap();
        let g = open(&s, &name).await;
        let mut back = vec![0u8; len];
        assert_eq!(g.read_at(0, &mut back).await.unwrap(), len);
        assert!(back == data, "{path:?} write differs");
    }
    s.cluster.stop().await;
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_gpu_backend_device_buffers_are_refused_with_the_reason() {
    let s = setup("nogpu", 26).await;
    striped_file(&s, "/f", 1000).await;
    let cfg = ClientConfig {
        creds: proto::md::Creds::root(),
        gpu: Some(Gpu(Arc::new(client::gpu::NoGpu))),
        ..ClientConfig::default()
    };
    let plain = s.cluster.client("plain", cfg).await.unwrap();
    let f = OpenOptions::new()
        .read(true)
        .open(&plain, "/f")
        .await
        .unwrap();
    let dev = s.gpu.alloc(1000).unwrap();
    let err = f
        .read_device(0, &dev.buf(), 0, 1000, io(IoPath::Auto))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Gpu(GpuError::NoBackend(_))),
        "{err}"
    );
    // And a pointer the GPU did not allocate is refused by the simulated one.
    let f = open(&s, "/f").await;
    let mut wild = dev.buf();
    wild.addr += 64 << 20;
    let err = f
        .read_device(0, &wild, 0, 1000, io(IoPath::Staged))
        .await
        .unwrap_err();
    assert!(err.is(proto::FsErrorKind::Invalid), "{err}");
    s.cluster.stop().await;
    let _ = std::fs::remove_dir_all(&s.dir);
}
