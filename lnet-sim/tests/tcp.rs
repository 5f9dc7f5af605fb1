//! The TCP backend against real sockets on loopback.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{echo, Gate};
use lnet::selftest::{pattern, SelfTest};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError, RegionError, Service, Transport};
use proto::msg::{BulkRead, BulkWrite, Echo, Ping};
use proto::{BulkDesc, Nid, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(10);

async fn server(service: Arc<dyn Service>, cfg: TcpConfig) -> (TcpEndpoint, Nid) {
    let ep = TcpEndpoint::bind("127.0.0.1:0".parse().unwrap(), service, cfg)
        .await
        .unwrap();
    let nid = ep.nid();
    (ep, nid)
}

async fn selftest_server() -> (TcpEndpoint, Nid) {
    server(SelfTest::new(), TcpConfig::default()).await
}

#[tokio::test]
async fn ping_names_the_server_and_echo_returns_the_payload() {
    let (_srv, nid) = selftest_server().await;
    let client = TcpEndpoint::client(TcpConfig::default());
    let pong = call(&client, &nid, &Ping { nonce: 77 }, T).await.unwrap();
    assert_eq!((pong.nonce, &pong.nid), (77, &nid));
    let payload: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let back = call(
        &client,
        &nid,
        &Echo {
            payload: payload.clone(),
        },
        T,
    )
    .await
    .unwrap();
    assert_eq!(back.payload, payload);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_in_flight_are_matched_to_their_replies() {
    let (_srv, nid) = server(Gate::open(), TcpConfig::default()).await;
    let client = Arc::new(TcpEndpoint::client(TcpConfig {
        conns_per_peer: 1,
        ..Default::default()
    }));
    let calls = (0..256u64).map(|i| {
        let (client, nid) = (client.clone(), nid.clone());
        tokio::spawn(async move { (i, call(&*client, &nid, &echo(i), T).await.unwrap()) })
    });
    for c in calls {
        let (i, reply) = c.await.unwrap();
        assert_eq!(reply, echo(i));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_read_lands_in_the_callers_region_and_write_pulls_from_it() {
    let (_srv, nid) = selftest_server().await;
    let client = TcpEndpoint::client(TcpConfig::default());
    let len = 3 << 20;
    let region = client.register(vec![0u8; len]).unwrap();
    // Two reads into disjoint halves, concurrently, then a write of the whole region.
    let half = (len / 2) as u32;
    let first = BulkRead {
        desc: region.desc(0, half, false).unwrap(),
        seed: 1,
    };
    let second = BulkRead {
        desc: region.desc(u64::from(half), half, false).unwrap(),
        seed: 2,
    };
    let (a, b) = tokio::join!(
        call(&client, &nid, &first, T),
        call(&client, &nid, &second, T)
    );
    assert_eq!(a.unwrap().bytes, u64::from(half));
    assert_eq!(b.unwrap().bytes, u64::from(half));
    {
        let got = region.read(0, len as u64).unwrap();
        assert_eq!(
            &got.as_slice()[..half as usize],
            &pattern(1, half as usize)[..]
        );
        assert_eq!(
            &got.as_slice()[half as usize..],
            &pattern(2, half as usize)[..]
        );
    }
    let desc = region.desc(0, len as u32, true).unwrap();
    let done = call(&client, &nid, &BulkWrite { desc: desc.clone() }, T)
        .await
        .unwrap();
    assert_eq!(done.bytes, len as u64);
    assert_eq!(Some(done.crc32c), desc.crc32c);
}

#[tokio::test]
async fn bulk_refuses_unknown_keys_out_of_bounds_and_deregistered_regions() {
    let (_srv, nid) = selftest_server().await;
    let client = TcpEndpoint::client(TcpConfig::default());
    let region = client.register(vec![0u8; 4096]).unwrap();
    let key = region.key();
    let read = |desc: BulkDesc| BulkRead { desc, seed: 3 };
    let d = |key, offset, len| BulkDesc {
        key,
        offset,
        len,
        crc32c: None,
    };

    let err = call(&client, &nid, &read(d(key ^ 0xdead, 0, 16)), T)
        .await
        .unwrap_err();
    assert!(
        matches!(err, NetError::Region(RegionError::UnknownKey { .. })),
        "{err}"
    );
    let err = call(&client, &nid, &read(d(key, 4000, 100)), T)
        .await
        .unwrap_err();
    assert!(
        matches!(err, NetError::Region(RegionError::OutOfBounds { .. })),
        "{err}"
    );
    let err = call(
        &client,
        &nid,
        &BulkWrite {
            desc: d(key, 4090, 7),
        },
        T,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, NetError::Remote { err, .. } if err.code == StatusCode::Bulk),
        "{err}"
    );

    // A write whose descriptor checksum does not match the memory is refused by the server.
    let mut bad = region.desc(0, 64, true).unwrap();
    bad.crc32c = bad.crc32c.map(|c| c ^ 1);
    let err = call(&client, &nid, &BulkWrite { desc: bad }, T)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NetError::Remote { err, .. } if err.code == StatusCode::Checksum),
        "{err}"
    );

    let _buf = region.deregister().await;
    let err = call(&client, &nid, &read(d(key, 0, 16)), T)
        .await
        .unwrap_err();
    assert!(
        matches!(err, NetError::Region(RegionError::UnknownKey { .. })),
        "{err}"
    );
    // The connection survived every refusal.
    call(&client, &nid, &Ping { nonce: 1 }, T).await.unwrap();
}

#[tokio::test]
async fn a_full_queue_answers_busy_and_runs_nothing_it_refused() {
    let gate = Gate::closed();
    let (_srv, nid) = server(
        gate.clone(),
        TcpConfig {
            queue_slots: 2,
            ..Default::default()
        },
    )
    .await;
    let client = Arc::new(TcpEndpoint::client(TcpConfig {
        conns_per_peer: 1,
        ..Default::default()
    }));
    let held: Vec<_> = (0..2u64)
        .map(|i| {
            let (client, nid) = (client.clone(), nid.clone());
            tokio::spawn(async move { call(&*client, &nid, &echo(i), T).await })
        })
        .collect();
    gate.wait_entered(2).await;
    let err = call(&*client, &nid, &echo(99), T).await.unwrap_err();
    assert!(matches!(err, NetError::Busy { .. }), "{err}");
    assert!(err.is_retryable());
    gate.release(2);
    for h in held {
        h.await.unwrap().unwrap();
    }
    assert_eq!(gate.seen().len(), 2, "the refused request was not executed");
    // With room again, the same call goes through.
    gate.release(1);
    call(&*client, &nid, &echo(99), T).await.unwrap();
}

#[tokio::test]
async fn a_call_gives_up_at_its_deadline() {
    let gate = Gate::closed();
    let (_srv, nid) = server(gate.clone(), TcpConfig::default()).await;
    let client = TcpEndpoint::client(TcpConfig::default());
    let err = call(&client, &nid, &echo(1), Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::Timeout { .. }), "{err}");
}

#[tokio::test]
async fn a_dead_peer_is_an_error_and_a_restarted_one_is_reconnected() {
    let (srv, nid) = selftest_server().await;
    let client = TcpEndpoint::client(TcpConfig {
        conns_per_peer: 1,
        ..Default::default()
    });
    call(&client, &nid, &Ping { nonce: 1 }, T).await.unwrap();
    srv.shutdown();
    drop(srv);
    let err = call(&client, &nid, &Ping { nonce: 2 }, T)
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let addr = nid.socket_addr().unwrap();
    let _srv = TcpEndpoint::bind(addr, SelfTest::new(), TcpConfig::default())
        .await
        .unwrap();
    let pong = call(&client, &nid, &Ping { nonce: 3 }, T).await.unwrap();
    assert_eq!(pong.nonce, 3);
}

/// A frame with a valid header for `body`, then `patch` applied at byte offsets.
fn raw_frame(body: &[u8], patch: &[(usize, &[u8])]) -> Vec<u8> {
    use proto::frame::{encode_frame, FrameKind, Header};
    let mut f = encode_frame(
        Header::new(FrameKind::Request, proto::msg::opcodes::ECHO, 1),
        body,
    );
    for (at, bytes) in patch {
        f[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    f
}

/// Sends `bytes` on a fresh connection and waits for the server to close it.
async fn server_closes_after(addr: std::net::SocketAddr, bytes: Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&bytes).await.unwrap();
    s.shutdown().await.unwrap_or(());
    let mut sink = Vec::new();
    // The server answers garbage by closing: read returns end of stream (or a reset).
    let _ = tokio::time::timeout(T, s.read_to_end(&mut sink))
        .await
        .expect("server kept a garbage connection open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_connections_are_closed_and_good_clients_keep_being_served() {
    let (srv, nid) = selftest_server().await;
    let addr = nid.socket_addr().unwrap();
    let good = TcpEndpoint::client(TcpConfig::default());
    let body = proto::msg::encode_body(&echo(5)).unwrap();
    let cases: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        raw_frame(&body, &[(0, b"EDOL")]),
        raw_frame(&body, &[(4, &[2, 0])]),
        raw_frame(&body, &[(6, &[0xee, 0xee])]),
        raw_frame(&body, &[(12, &[0xff, 0xff, 0xff, 0x7f])]),
        raw_frame(&body, &[(28, &[0, 0, 0, 0])]),
        raw_frame(&body, &[])[..40].to_vec(),
        raw_frame(b"\x05abc", &[]),
    ];
    for round in 0..8 {
        let floods = cases
            .iter()
            .cloned()
            .map(|c| tokio::spawn(server_closes_after(addr, c)));
        let ping = Ping { nonce: round };
        let served = call(&good, &nid, &ping, T);
        let ((), served) = tokio::join!(join_all(floods.collect()), served);
        assert_eq!(served.unwrap().nonce, round);
    }
    assert_eq!(
        srv.accepted_connections(),
        2,
        "only the good client's connections remain"
    );
}

async fn join_all(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_cut_off() {
    let cfg = TcpConfig {
        send_queue: 4,
        send_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let (_srv, nid) = server(Gate::open(), cfg).await;
    let mut s = TcpStream::connect(nid.socket_addr().unwrap())
        .await
        .unwrap();
    // Large echoes, never read: replies fill the socket buffers, then the send queue.
    let big = proto::msg::encode_body(&Echo {
        payload: vec![7u8; 900_000],
    })
    .unwrap();
    let frame = raw_frame(&big, &[]);
    let mut cut_off = false;
    for _ in 0..200 {
        if s.write_all(&frame).await.is_err() {
            cut_off = true;
            break;
        }
    }
    if !cut_off {
        // Everything was accepted; the server must still close the connection.
        let mut buf = vec![0u8; 1 << 20];
        s.shutdown().await.unwrap_or(());
        let read_all = async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        };
        tokio::time::timeout(T * 3, read_all)
            .await
            .expect("a non-reading peer was never cut off");
    }
}

#[tokio::test]
async fn a_body_past_the_limit_is_refused_before_it_is_sent() {
    let (_srv, nid) = selftest_server().await;
    let client = TcpEndpoint::client(TcpConfig::default());
    let huge = Echo {
        payload: vec![0u8; proto::MAX_BODY as usize + 1],
    };
    let err = call(&client, &nid, &huge, T).await.unwrap_err();
    assert!(
        matches!(
            err,
            NetError::Frame {
                err: proto::FrameError::BodyTooLarge { .. },
                ..
            }
        ),
        "{err}"
    );
    let raw = client
        .call_raw(
            &nid,
            proto::msg::opcodes::ECHO,
            vec![0u8; proto::MAX_BODY as usize + 1],
            T,
        )
        .await
        .unwrap_err();
    assert!(matches!(raw, NetError::Frame { .. }), "{raw}");
    call(&client, &nid, &Ping { nonce: 1 }, T).await.unwrap();
}

/// Idle sockets cannot lock real clients out: at the connection cap, a new connection takes
/// the place of the one idle longest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_idle_connections_do_not_stop_a_real_client() {
    let (srv, nid) = selftest_server().await;
    let Nid::Tcp(addr) = nid.clone() else {
        unreachable!("a TCP server")
    };
    let openers: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(async move {
                let mut mine = Vec::with_capacity(100);
                for _ in 0..100 {
                    mine.push(TcpStream::connect(addr).await.expect("an idle connection"));
                }
                mine
            })
        })
        .collect();
    let mut idle = Vec::with_capacity(5000);
    for o in openers {
        idle.extend(o.await.unwrap());
    }
    // Let them all be accepted and go idle past the displacement threshold.
    tokio::time::sleep(TcpConfig::default().displace_idle + Duration::from_millis(500)).await;
    assert!(srv.accepted_connections() <= TcpConfig::default().max_connections);
    let client = TcpEndpoint::client(TcpConfig::default());
    let pong = call(&client, &nid, &Ping { nonce: 5 }, T).await.unwrap();
    assert_eq!(pong.nonce, 5);
    for i in 0..20 {
        call(&client, &nid, &echo(i), T).await.unwrap();
    }
    drop(idle);
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_its_peer_reconnects() {
    let cfg = TcpConfig {
        idle_timeout: Duration::from_millis(200),
        ..TcpConfig::default()
    };
    let (srv, nid) = server(SelfTest::new(), cfg).await;
    let client = TcpEndpoint::client(TcpConfig::default());
    call(&client, &nid, &Ping { nonce: 1 }, T).await.unwrap();
    assert!(srv.accepted_connections() >= 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        srv.accepted_connections(),
        0,
        "idle connections stayed open"
    );
    // The client finds its connection closed and makes a new one.
    let mut answered = false;
    for _ in 0..3 {
        if call(&client, &nid, &Ping { nonce: 2 }, T).await.is_ok() {
            answered = true;
            break;
        }
    }
    assert!(answered);
}
