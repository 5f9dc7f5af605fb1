//! The simulated fabric: every fault it offers, RDMA's rules, and replay from a seed.
//!
//! Tests run on tokio's paused clock: time advances only when every task waits, so latencies
//! and timeouts are exact and nothing sleeps for real.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{echo, Gate};
use lnet::selftest::{pattern, SelfTest};
use lnet::sim::{Fabric, Fate, LinkParams};
use lnet::{call, NetError, RegionError, Transport};
use proto::msg::{BulkRead, BulkWrite, Ping};
use proto::{BulkDesc, Nid};
use tokio::time::Instant;

const T: Duration = Duration::from_secs(1);

fn sim(name: &str) -> Nid {
    Nid::sim(name).unwrap()
}

fn fabric_with_server(seed: u64) -> Fabric {
    let f = Fabric::new(seed);
    f.start_node("oss0", Some(SelfTest::new())).unwrap();
    f
}

#[tokio::test(start_paused = true)]
async fn rpc_and_bulk_work_across_the_fabric() {
    let f = fabric_with_server(1);
    let c = f.start_node("c0", None).unwrap();
    let pong = call(&c, &sim("oss0"), &Ping { nonce: 9 }, T).await.unwrap();
    assert_eq!((pong.nonce, pong.nid), (9, sim("oss0")));

    let region = c.register(vec![0u8; 1 << 20]).unwrap();
    let read = BulkRead {
        desc: region.desc(4096, 65536, false).unwrap(),
        seed: 5,
    };
    call(&c, &sim("oss0"), &read, T).await.unwrap();
    assert_eq!(
        region.read(4096, 65536).unwrap().as_slice(),
        &pattern(5, 65536)[..]
    );
    assert!(region
        .read(0, 4096)
        .unwrap()
        .as_slice()
        .iter()
        .all(|&b| b == 0));

    let write = BulkWrite {
        desc: region.desc(0, 1 << 20, true).unwrap(),
    };
    let done = call(&c, &sim("oss0"), &write, T).await.unwrap();
    assert_eq!(Some(done.crc32c), write.desc.crc32c);
}

#[tokio::test(start_paused = true)]
async fn latency_and_bandwidth_set_the_time_a_transfer_takes() {
    let f = fabric_with_server(1);
    let c = f.start_node("c0", None).unwrap();
    f.set_default_link(LinkParams {
        latency: Duration::from_millis(2),
        bandwidth: 100_000_000,
        ..Default::default()
    })
    .unwrap();
    let region = c.register(vec![0u8; 1_000_000]).unwrap();
    let t0 = Instant::now();
    call(
        &c,
        &sim("oss0"),
        &BulkRead {
            desc: region.desc(0, 1_000_000, false).unwrap(),
            seed: 1,
        },
        T,
    )
    .await
    .unwrap();
    let took = t0.elapsed();
    // Request and reply: 2 ms each plus their few bytes; the bulk put: 10 ms plus 2 ms. Timers
    // resolve to 1 ms, so each of the three hops may land up to 1 ms late.
    assert!(took >= Duration::from_millis(16), "{took:?}");
    assert!(took <= Duration::from_millis(19), "{took:?}");
    let trace = f.trace();
    let put = trace.iter().find(|e| e.kind == "bulk-put").unwrap();
    assert_eq!(
        put.fate,
        Fate::Delivered {
            after: vec![Duration::from_millis(12)]
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_message_ends_in_the_callers_deadline() {
    let f = fabric_with_server(1);
    let c = f.start_node("c0", None).unwrap();
    f.set_link(
        "c0",
        "oss0",
        LinkParams {
            loss: 1.0,
            ..Default::default()
        },
    )
    .unwrap();
    let err = call(&c, &sim("oss0"), &Ping { nonce: 1 }, T)
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::Timeout { .. }), "{err}");
    assert_eq!(f.trace().last().unwrap().fate, Fate::Lost);
}

#[tokio::test(start_paused = true)]
async fn a_duplicated_request_runs_twice_but_completes_the_call_once() {
    let f = Fabric::new(2);
    let gate = Gate::open();
    f.start_node("s", Some(gate.clone())).unwrap();
    let c = f.start_node("c", None).unwrap();
    f.set_link(
        "c",
        "s",
        LinkParams {
            duplicate: 1.0,
            latency: Duration::from_micros(5),
            ..Default::default()
        },
    )
    .unwrap();
    let reply = call(&c, &sim("s"), &echo(4), T).await.unwrap();
    assert_eq!(reply, echo(4));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(gate.seen(), vec![echo(4).payload, echo(4).payload]);
}

#[tokio::test(start_paused = true)]
async fn reordering_lets_later_messages_overtake() {
    let f = Fabric::new(3);
    let gate = Gate::open();
    f.start_node("s", Some(gate.clone())).unwrap();
    let c = Arc::new(f.start_node("c", None).unwrap());
    f.set_link(
        "c",
        "s",
        LinkParams {
            latency: Duration::from_millis(1),
            reorder: 0.5,
            reorder_window: Duration::from_millis(20),
            ..Default::default()
        },
    )
    .unwrap();
    let calls: Vec<_> = (0..50u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { call(&*c, &sim("s"), &echo(i), T).await.unwrap() })
        })
        .collect();
    for h in calls {
        h.await.unwrap();
    }
    let order: Vec<u64> = gate
        .seen()
        .iter()
        .map(|p| u64::from_le_bytes(p[..8].try_into().unwrap()))
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..50).collect::<Vec<_>>(),
        "every request arrived once"
    );
    assert_ne!(order, sorted, "some request overtook another");
}

#[tokio::test(start_paused = true)]
async fn a_one_way_cut_loses_one_direction_only() {
    let f = Fabric::new(4);
    let gate_s = Gate::open();
    let gate_c = Gate::open();
    f.start_node("s", Some(gate_s.clone())).unwrap();
    let c = f.start_node("c", Some(gate_c.clone())).unwrap();
    let s = f.start_node("s2", None).unwrap();
    drop(s);
    f.cut_oneway("c", "s");
    // c's request never reaches s.
    let err = call(&c, &sim("s"), &echo(1), T).await.unwrap_err();
    assert!(matches!(err, NetError::Timeout { .. }), "{err}");
    assert!(gate_s.seen().is_empty());
    f.heal();
    call(&c, &sim("s"), &echo(2), T).await.unwrap();
    assert_eq!(gate_s.seen(), vec![echo(2).payload]);

    // Cut the other way: the request arrives and runs, the reply is lost.
    f.cut_oneway("s", "c");
    let err = call(&c, &sim("s"), &echo(3), T).await.unwrap_err();
    assert!(matches!(err, NetError::Timeout { .. }), "{err}");
    assert_eq!(gate_s.seen().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_partition_isolates_both_ways_until_healed() {
    let f = fabric_with_server(5);
    let c = f.start_node("c", None).unwrap();
    let region = c.register(vec![0u8; 1024]).unwrap();
    f.partition("c", "oss0");
    let err = call(&c, &sim("oss0"), &Ping { nonce: 1 }, T)
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::Timeout { .. }), "{err}");
    assert!(f.trace().iter().any(|e| e.fate == Fate::Partitioned));
    f.heal();
    call(
        &c,
        &sim("oss0"),
        &BulkRead {
            desc: region.desc(0, 1024, false).unwrap(),
            seed: 1,
        },
        T,
    )
    .await
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_bulk_transfer_over_a_cut_link_fails() {
    let f = fabric_with_server(6);
    let c = f.start_node("c", None).unwrap();
    let region = c.register(vec![0u8; 1024]).unwrap();
    // Requests reach the server, but its puts toward c cannot.
    f.cut_oneway("oss0", "c");
    let read = BulkRead {
        desc: region.desc(0, 1024, false).unwrap(),
        seed: 1,
    };
    let err = call(&c, &sim("oss0"), &read, T).await.unwrap_err();
    // The server's failure reply is lost on the same cut link: the caller times out.
    assert!(matches!(err, NetError::Timeout { .. }), "{err}");
    let bulk: Vec<_> = f
        .trace()
        .into_iter()
        .filter(|e| e.kind == "bulk-put")
        .collect();
    assert_eq!(bulk.len(), 1);
    assert_eq!(bulk[0].fate, Fate::Partitioned);
}

#[tokio::test(start_paused = true)]
async fn a_crash_fails_waiting_calls_and_loses_registered_memory() {
    let f = Fabric::new(7);
    let gate = Gate::closed();
    f.start_node("s", Some(gate.clone())).unwrap();
    let c = Arc::new(f.start_node("c", None).unwrap());
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move { call(&*c, &sim("s"), &echo(1), T).await })
    };
    gate.wait_entered(1).await;
    f.crash("s");
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, NetError::NodeDown { .. }), "{err}");
    let err = call(&*c, &sim("s"), &echo(2), T).await.unwrap_err();
    assert!(matches!(err, NetError::NodeDown { .. }), "{err}");
    assert!(!f.is_up("s"));

    // The client crashes with memory registered: its keys die with it.
    f.start_node("s", Some(SelfTest::new())).unwrap();
    let region = c.register(vec![0u8; 64]).unwrap();
    let key = region.key();
    f.crash("c");
    assert!(c.regions().is_empty());
    let c2 = f.start_node("c", None).unwrap();
    assert_eq!(c2.generation(), 2);
    let stale = BulkRead {
        desc: BulkDesc {
            key,
            offset: 0,
            len: 64,
            crc32c: None,
        },
        seed: 1,
    };
    let err = call(&c2, &sim("s"), &stale, T).await.unwrap_err();
    assert!(matches!(&err, NetError::Remote { .. }), "{err}");
    // A crashed node cannot call out either.
    let err = call(&*c, &sim("s"), &Ping { nonce: 1 }, T)
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::NodeDown { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_server_serves_again() {
    let f = fabric_with_server(8);
    let c = f.start_node("c", None).unwrap();
    call(&c, &sim("oss0"), &Ping { nonce: 1 }, T).await.unwrap();
    assert!(
        f.start_node("oss0", None).is_err(),
        "a running node cannot be started twice"
    );
    f.crash("oss0");
    let restarted = f.start_node("oss0", Some(SelfTest::new())).unwrap();
    assert_eq!(restarted.generation(), 2);
    call(&c, &sim("oss0"), &Ping { nonce: 2 }, T).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn rdma_rules_refuse_bad_keys_bounds_and_deregistered_memory() {
    let f = fabric_with_server(9);
    let c = f.start_node("c", None).unwrap();
    let region = c.register(vec![0u8; 100]).unwrap();
    let key = region.key();
    let read = |key, offset, len| BulkRead {
        desc: BulkDesc {
            key,
            offset,
            len,
            crc32c: None,
        },
        seed: 0,
    };
    let reason = |e: NetError| match e {
        NetError::Remote { err, .. } => err.message,
        other => panic!("expected a refusal from the server, got {other}"),
    };
    let e = call(&c, &sim("oss0"), &read(key + 1, 0, 10), T)
        .await
        .unwrap_err();
    assert!(reason(e).contains(&RegionError::UnknownKey { key: key + 1 }.to_string()));
    let e = call(&c, &sim("oss0"), &read(key, 95, 10), T)
        .await
        .unwrap_err();
    assert!(reason(e).contains("outside region"));
    let _ = region.deregister().await;
    let e = call(&c, &sim("oss0"), &read(key, 0, 10), T)
        .await
        .unwrap_err();
    assert!(reason(e).contains("no region"));
}

#[tokio::test(start_paused = true)]
async fn a_call_to_another_network_is_refused() {
    let f = Fabric::new(1);
    let c = f.start_node("c", None).unwrap();
    let err = call(
        &c,
        &"127.0.0.1:1@tcp".parse().unwrap(),
        &Ping { nonce: 1 },
        T,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, NetError::WrongNetwork { .. }), "{err}");
}

/// A workload touching every random choice: loss, duplication, reordering, bulk both ways.
async fn faulty_run(seed: u64) -> Vec<lnet::sim::TraceEvent> {
    let f = fabric_with_server(seed);
    f.set_default_link(LinkParams {
        latency: Duration::from_micros(20),
        bandwidth: 5_000_000_000,
        loss: 0.1,
        duplicate: 0.1,
        reorder: 0.3,
        reorder_window: Duration::from_micros(200),
    })
    .unwrap();
    let c = Arc::new(f.start_node("c", None).unwrap());
    let region = Arc::new(c.register(vec![1u8; 1 << 16]).unwrap());
    let calls: Vec<_> = (0..40u64)
        .map(|i| {
            let (c, region) = (c.clone(), region.clone());
            tokio::spawn(async move {
                let off = (i % 16) * 4096;
                let short = Duration::from_millis(5);
                let _ = call(&*c, &sim("oss0"), &Ping { nonce: i }, short).await;
                let _ = call(
                    &*c,
                    &sim("oss0"),
                    &BulkWrite {
                        desc: region.desc(off, 4096, true).unwrap(),
                    },
                    short,
                )
                .await;
            })
        })
        .collect();
    for h in calls {
        h.await.unwrap();
    }
    f.trace()
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_trace() {
    let a = faulty_run(42).await;
    let b = faulty_run(42).await;
    assert!(a.iter().any(|e| e.fate == Fate::Lost));
    assert!(a
        .iter()
        .any(|e| matches!(&e.fate, Fate::Delivered { after } if after.len() == 2)));
    assert_eq!(a, b);
    let other = faulty_run(43).await;
    assert_ne!(a, other, "another seed takes another path");
}

/// Device memory as a test stands it in: bytes the CPU of the test may inspect, reached by the
/// fabric only through the DMA calls, which are counted.
struct TestDevice {
    mem: parking_lot::Mutex<Vec<u8>>,
    base: u64,
    writes: std::sync::atomic::AtomicU64,
}

impl lnet::DeviceDma for TestDevice {
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), lnet::DeviceError> {
        let off = (addr - self.base) as usize;
        self.mem.lock()[off..off + src.len()].copy_from_slice(src);
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), lnet::DeviceError> {
        let off = (addr - self.base) as usize;
        dst.copy_from_slice(&self.mem.lock()[off..off + dst.len()]);
        Ok(())
    }
}

fn test_device(len: usize) -> (Arc<TestDevice>, lnet::DeviceMemory) {
    let dev = Arc::new(TestDevice {
        mem: parking_lot::Mutex::new(vec![0u8; len]),
        base: 0x7000_0000_0000,
        writes: Default::default(),
    });
    let mem = lnet::DeviceMemory {
        addr: dev.base,
        len: len as u64,
        ordinal: 0,
        dma: dev.clone(),
    };
    (dev, mem)
}

#[tokio::test(start_paused = true)]
async fn bulk_transfers_reach_registered_device_memory_only_through_its_dma_engine() {
    let f = fabric_with_server(3);
    let c = f.start_node("c0", None).unwrap();
    let (dev, mem) = test_device(1 << 16);
    let region = c.register_device(mem).unwrap();
    assert_eq!(region.kind(), lnet::MemoryKind::Device { ordinal: 0 });
    // No CPU view of device memory, and no checksum taken from it.
    assert!(matches!(
        region.read(0, 1),
        Err(RegionError::DeviceMemory { .. })
    ));
    assert_eq!(region.desc(0, 16, true).unwrap().crc32c, None);
    let read = BulkRead {
        desc: region.desc(100, 5000, false).unwrap(),
        seed: 8,
    };
    call(&c, &sim("oss0"), &read, T).await.unwrap();
    assert_eq!(&dev.mem.lock()[100..5100], &pattern(8, 5000)[..]);
    assert!(dev.mem.lock()[..100].iter().all(|&b| b == 0));
    // The server's get of device memory goes through the engine as well.
    dev.mem.lock()[..4096].copy_from_slice(&pattern(9, 4096));
    let write = BulkWrite {
        desc: region.desc(0, 4096, false).unwrap(),
    };
    let done = call(&c, &sim("oss0"), &write, T).await.unwrap();
    assert_eq!(done.crc32c, crc32c::crc32c(&pattern(9, 4096)));

    // A node whose NIC refuses device registrations says so.
    f.refuse_device_registrations("c0", true);
    let (_, mem) = test_device(4096);
    assert!(matches!(
        c.register_device(mem),
        Err(NetError::NoDeviceMemory(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn nothing_is_written_to_device_memory_after_its_deregistration() {
    let f = fabric_with_server(4);
    let c = f.start_node("c0", None).unwrap();
    f.set_default_link(LinkParams {
        latency: Duration::from_millis(5),
        ..Default::default()
    })
    .unwrap();
    let (dev, mem) = test_device(1 << 16);
    let region = c.register_device(mem).unwrap();
    let desc = region.desc(0, 1 << 16, false).unwrap();
    let c2 = c.clone();
    let call_task =
        tokio::spawn(async move { call(&c2, &sim("oss0"), &BulkRead { desc, seed: 3 }, T).await });
    // The request is on its way; the owner lets go of the memory before the put lands.
    tokio::time::sleep(Duration::from_millis(6)).await;
    region.deregister().await;
    let writes = dev.writes.load(std::sync::atomic::Ordering::SeqCst);
    let outcome = call_task.await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        dev.writes.load(std::sync::atomic::Ordering::SeqCst),
        writes,
        "device memory was written after deregistration"
    );
    assert!(
        outcome.is_err(),
        "the transfer into deregistered memory succeeded"
    );
    assert!(dev.mem.lock().iter().all(|&b| b == 0));
}

#[tokio::test]
async fn tcp_refuses_device_memory_and_the_client_stages_instead() {
    let ep = lnet::tcp::TcpEndpoint::client(lnet::tcp::TcpConfig::default());
    let (_, mem) = test_device(4096);
    assert!(matches!(
        ep.register_device(mem),
        Err(NetError::NoDeviceMemory(_))
    ));
}
