//! The TCP backend against real sockets on loopback.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{echo, Gate};
use lnet::auth::{KeyFile, Keyring, Security};
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

/// This test process's cluster key.
fn keys() -> Arc<Keyring> {
    Arc::new(Keyring::new(&cluster_key()))
}

fn cluster_key() -> KeyFile {
    static KEY_LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let line = KEY_LINE.get_or_init(|| KeyFile::generate().unwrap().to_line());
    KeyFile::parse(line).unwrap()
}

/// A server's settings, authenticating with the cluster key.
fn srv_cfg() -> TcpConfig {
    TcpConfig {
        security: Security::server(keys(), false).unwrap(),
        ..TcpConfig::default()
    }
}

/// A client's settings, with the client key.
fn cli_cfg() -> TcpConfig {
    let client = Arc::new(Keyring::new(&cluster_key().client_key()));
    TcpConfig {
        security: Security::client(client, false),
        ..TcpConfig::default()
    }
}

async fn selftest_server() -> (TcpEndpoint, Nid) {
    server(SelfTest::new(), srv_cfg()).await
}

/// A raw connection to a server running without authentication, past the handshake: what
/// follows is read as frames.
async fn raw_conn(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    lnet::auth::initiate(&mut s, &Security::Off, T)
        .await
        .unwrap();
    s
}

#[tokio::test]
async fn ping_names_the_server_and_echo_returns_the_payload() {
    let (_srv, nid) = selftest_server().await;
    let client = TcpEndpoint::client(cli_cfg());
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
    let (_srv, nid) = server(Gate::open(), srv_cfg()).await;
    let client = Arc::new(TcpEndpoint::client(TcpConfig {
        conns_per_peer: 1,
        ..cli_cfg()
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
    let client = TcpEndpoint::client(cli_cfg());
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
    let client = TcpEndpoint::client(cli_cfg());
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
            ..srv_cfg()
        },
    )
    .await;
    let client = Arc::new(TcpEndpoint::client(TcpConfig {
        conns_per_peer: 1,
        ..cli_cfg()
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
    let (_srv, nid) = server(gate.clone(), srv_cfg()).await;
    let client = TcpEndpoint::client(cli_cfg());
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
        ..cli_cfg()
    });
    call(&client, &nid, &Ping { nonce: 1 }, T).await.unwrap();
    srv.shutdown();
    drop(srv);
    let err = call(&client, &nid, &Ping { nonce: 2 }, T)
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let addr = nid.socket_addr().unwrap();
    let _srv = TcpEndpoint::bind(addr, SelfTest::new(), srv_cfg())
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

/// Sends `bytes` on a fresh connection (after the handshake, when `bytes` are frames) and
/// waits for the server to close it.
async fn server_closes_after(addr: std::net::SocketAddr, bytes: Vec<u8>) {
    let frames = bytes.starts_with(b"LODE");
    let mut s = if frames {
        raw_conn(addr).await
    } else {
        TcpStream::connect(addr).await.unwrap()
    };
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
    // Without authentication, so that garbage frames reach the frame decoder.
    let (srv, nid) = server(SelfTest::new(), TcpConfig::default()).await;
    let addr = nid.socket_addr().unwrap();
    let good = TcpEndpoint::client(TcpConfig::default());
    let body = proto::msg::encode_body(&echo(5)).unwrap();
    let cases: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"LODX\x01\x00\x00\x00\x00\x00".to_vec(),
        b"XODE\x01\x01\x00\x00\x00\x20abc".to_vec(),
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
    let mut s = raw_conn(nid.socket_addr().unwrap()).await;
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
    let client = TcpEndpoint::client(cli_cfg());
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
            None,
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
    let client = TcpEndpoint::client(cli_cfg());
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
        ..srv_cfg()
    };
    let (srv, nid) = server(SelfTest::new(), cfg).await;
    let client = TcpEndpoint::client(cli_cfg());
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

/// A peer without the cluster's key gets a refusal and nothing else; so does one with no key
/// at all, and a client key cannot pose as a server.
#[tokio::test]
async fn a_peer_without_the_key_is_refused() {
    let (srv, nid) = selftest_server().await;
    let stranger = Arc::new(Keyring::new(&KeyFile::generate().unwrap()));
    let client_only = Arc::new(Keyring::new(&cluster_key().client_key()));
    let posing = Security::Keyed {
        keys: client_only,
        role: lnet::auth::Role::Server,
        privacy: false,
    };
    for security in [Security::client(stranger, false), Security::Off, posing] {
        let ep = TcpEndpoint::client(TcpConfig {
            security,
            ..TcpConfig::default()
        });
        let err = call(&ep, &nid, &Ping { nonce: 1 }, T).await.unwrap_err();
        assert!(
            matches!(err, NetError::Refused { .. }) || matches!(err, NetError::BadConfig(_)),
            "{err}"
        );
        assert!(!err.is_retryable(), "{err}");
    }
    assert_eq!(srv.accepted_connections(), 0);
    // A keyed client does not talk to a server that cannot prove it holds the key.
    let (_open, open_nid) = server(SelfTest::new(), TcpConfig::default()).await;
    let err = call(
        &TcpEndpoint::client(cli_cfg()),
        &open_nid,
        &Ping { nonce: 2 },
        T,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, NetError::Refused { .. }), "{err}");
}

/// A server that requires privacy encrypts calls and bulk data both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn privacy_carries_calls_and_bulk_data() {
    let (_srv, nid) = server(
        SelfTest::new(),
        TcpConfig {
            security: Security::server(keys(), true).unwrap(),
            ..TcpConfig::default()
        },
    )
    .await;
    let client = TcpEndpoint::client(cli_cfg());
    assert_eq!(call(&client, &nid, &echo(4), T).await.unwrap(), echo(4));
    let len = 1 << 20;
    let region = client.register(vec![0u8; len]).unwrap();
    let read = BulkRead {
        desc: region.desc(0, len as u32, false).unwrap(),
        seed: 9,
    };
    call(&client, &nid, &read, T).await.unwrap();
    assert_eq!(
        region.read(0, len as u64).unwrap().as_slice(),
        &pattern(9, len)[..]
    );
    let write = BulkWrite {
        desc: region.desc(0, len as u32, true).unwrap(),
    };
    call(&client, &nid, &write, T).await.unwrap();
}

/// One changed byte on the wire, anywhere after the handshake, closes the connection: the
/// changed request is never served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_byte_on_the_wire_is_never_served() {
    let (_srv, nid) = selftest_server().await;
    let upstream = nid.socket_addr().unwrap();
    for flip_at in [120usize, 140, 200, 400] {
        // A relay that flips one byte of what the client sends, `flip_at` bytes in (the
        // handshake takes fewer).
        let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = relay.accept().await {
                tokio::spawn(async move {
                    let mut up = TcpStream::connect(upstream).await.unwrap();
                    let (mut dr, mut dw) = down.split();
                    let (mut ur, mut uw) = up.split();
                    let to_server = async {
                        let mut seen = 0usize;
                        let mut buf = vec![0u8; 1 << 16];
                        loop {
                            let n = match dr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if (seen..seen + n).contains(&flip_at) {
                                buf[flip_at - seen] ^= 0x20;
                            }
                            seen += n;
                            if uw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = uw.shutdown().await;
                    };
                    let to_client = async {
                        let _ = tokio::io::copy(&mut ur, &mut dw).await;
                        let _ = dw.shutdown().await;
                    };
                    tokio::join!(to_server, to_client);
                });
            }
        });
        let client = TcpEndpoint::client(TcpConfig {
            conns_per_peer: 1,
            ..cli_cfg()
        });
        let via = Nid::Tcp(relay_addr);
        let payload = Echo {
            payload: vec![b'a'; 600],
        };
        let err = call(&client, &via, &payload, Duration::from_secs(3))
            .await
            .expect_err("a changed request was answered");
        assert!(err.is_retryable(), "{err}");
    }
}

/// A server that moves bytes with memory its request did not name: another region whose key it
/// learnt elsewhere, or past the named range.
struct Rogue {
    other_key: u64,
    past_the_end: bool,
}

impl Service for Rogue {
    fn handle(
        self: Arc<Self>,
        req: lnet::Incoming,
        bulk: Arc<dyn lnet::BulkPeer>,
    ) -> lnet::service::BoxFuture<'static, Result<Vec<u8>, proto::RemoteError>> {
        Box::pin(async move {
            let code = |e: NetError| proto::RemoteError::new(StatusCode::Bulk, e.to_string());
            let mut desc = match req.opcode {
                proto::msg::opcodes::BULK_READ => req.decode::<BulkRead>()?.desc,
                _ => req.decode::<BulkWrite>()?.desc,
            };
            if self.past_the_end {
                desc.offset += u64::from(desc.len);
            } else {
                desc.key = self.other_key;
            }
            desc.crc32c = None;
            if req.opcode == proto::msg::opcodes::BULK_READ {
                let data = bytes::Bytes::from(vec![0xEEu8; desc.len as usize]);
                bulk.put(&desc, data).await.map_err(code)?;
            } else {
                bulk.get(&desc).await.map_err(code)?;
            }
            lnet::service::reply::<BulkRead>(&proto::msg::BulkDone {
                bytes: u64::from(desc.len),
                crc32c: 0,
            })
        })
    }
}

/// A server reaches only the memory of the request it serves, in the direction the request
/// says: not another buffer of the same client, not past the named range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_transfer_outside_its_requests_buffer_is_refused() {
    let client = TcpEndpoint::client(cli_cfg());
    let named = client.register(vec![1u8; 8192]).unwrap();
    let secret = client.register(vec![2u8; 8192]).unwrap();
    for past_the_end in [false, true] {
        let (_srv, nid) = server(
            Arc::new(Rogue {
                other_key: secret.key(),
                past_the_end,
            }),
            srv_cfg(),
        )
        .await;
        let read = BulkRead {
            desc: named.desc(0, 4096, false).unwrap(),
            seed: 0,
        };
        let err = call(&client, &nid, &read, T).await.unwrap_err();
        assert!(
            matches!(err, NetError::Region(RegionError::NotGranted { .. })),
            "{err}"
        );
        let write = BulkWrite {
            desc: named.desc(0, 4096, true).unwrap(),
        };
        let err = call(&client, &nid, &write, T).await.unwrap_err();
        assert!(
            err.to_string().contains("outside what the request granted"),
            "{err}"
        );
    }
    assert!(named
        .read(0, 8192)
        .unwrap()
        .as_slice()
        .iter()
        .all(|&b| b == 1));
    assert!(secret
        .read(0, 8192)
        .unwrap()
        .as_slice()
        .iter()
        .all(|&b| b == 2));
}

/// A server on two addresses: a client told of both spreads its calls over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_two_addresses_takes_calls_on_both() {
    let addrs = [
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.2:0".parse().unwrap(),
    ];
    let srv = TcpEndpoint::bind_rails(&addrs, SelfTest::new(), srv_cfg())
        .await
        .unwrap();
    let nid = srv.nid();
    let rails = srv.rails();
    assert_eq!(rails.len(), 1);
    assert_ne!(rails[0], nid);
    let client = TcpEndpoint::client(TcpConfig {
        conns_per_peer: 1,
        ..cli_cfg()
    });
    client.set_peer_rails(&nid, &rails);
    let mut answered_at = std::collections::HashSet::new();
    for nonce in 0..10 {
        let pong = call(&client, &nid, &Ping { nonce }, T).await.unwrap();
        assert_eq!(pong.nonce, nonce);
        answered_at.insert(pong.nid);
    }
    // Each address carried calls, over one connection each.
    assert_eq!(answered_at, [nid, rails[0].clone()].into_iter().collect());
    assert_eq!(srv.accepted_connections(), 2);
}

/// Two servers standing for two paths to one peer: when one path goes (its endpoint shut
/// down), calls carry on over the other; an address that refuses connections is passed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_carry_on_over_the_rail_left_when_one_goes_down() {
    let (a, nid) = selftest_server().await;
    let b = TcpEndpoint::bind("127.0.0.3:0".parse().unwrap(), SelfTest::new(), srv_cfg())
        .await
        .unwrap();
    let client = TcpEndpoint::client(cli_cfg());
    client.set_peer_rails(&nid, &[b.nid()]);
    for nonce in 0..4 {
        call(&client, &nid, &Ping { nonce }, T).await.unwrap();
    }
    a.shutdown();
    drop(a);
    let mut served_by = std::collections::HashSet::new();
    for nonce in 0..20 {
        // A call in flight when the path went may fail, and is resent; none fails twice.
        let pong = match call(&client, &nid, &Ping { nonce }, T).await {
            Ok(p) => p,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                call(&client, &nid, &Ping { nonce }, T).await.unwrap()
            }
        };
        served_by.insert(pong.nid);
    }
    assert_eq!(served_by, [b.nid()].into_iter().collect());
}

/// A path that takes requests and never answers (a link gone dead under an open connection):
/// the call on it times out, the rail is set aside, and the next calls go over the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rail_that_stops_answering_is_set_aside() {
    let gate = Gate::closed();
    let (_hung, nid) = server(gate.clone(), srv_cfg()).await;
    let (_good, good) = server(Gate::open(), srv_cfg()).await;
    let client = TcpEndpoint::client(cli_cfg());
    client.set_peer_rails(&nid, &[good]);
    let short = Duration::from_millis(300);
    let mut timeouts = 0;
    for i in 0..10u64 {
        match call(&client, &nid, &echo(i), short).await {
            Ok(_) => {}
            Err(NetError::Timeout { .. }) => timeouts += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(timeouts, 1, "only the first call on the dead rail is lost");
}

/// A small write's bytes go with its request, after the range's key and offset, so the server
/// needs no round trip to pull them; a large write's bytes wait to be asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_writes_bytes_travel_with_its_request() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nid = Nid::Tcp(listener.local_addr().unwrap());
    // What the client sends, frame by frame, as a server running without authentication sees it.
    let seen = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        lnet::auth::accept(&mut s, &Security::Off, T).await.unwrap();
        let mut frames = vec![];
        for _ in 0..2 {
            let mut head = [0u8; proto::HEADER_LEN];
            s.read_exact(&mut head).await.unwrap();
            let h = proto::Header::decode(&head).unwrap();
            let mut body = vec![0u8; h.body_len as usize];
            s.read_exact(&mut body).await.unwrap();
            h.verify(&body).unwrap();
            let mut payload = vec![0u8; h.bulk_len as usize];
            s.read_exact(&mut payload).await.unwrap();
            frames.push((h, payload));
        }
        frames
    });
    let client = TcpEndpoint::client(TcpConfig {
        conns_per_peer: 1,
        ..TcpConfig::default()
    });
    let region = client.register(pattern(7, 200_000)).unwrap();
    let small = BulkWrite {
        desc: region.desc(1000, 3901, true).unwrap(),
    };
    let large = BulkWrite {
        desc: region.desc(0, 200_000, true).unwrap(),
    };
    // Nobody answers: each call ends at its deadline, once its frame is out.
    let short = Duration::from_millis(300);
    let _ = call(&client, &nid, &small, short).await;
    let _ = call(&client, &nid, &large, short).await;
    let frames = tokio::time::timeout(T, seen).await.unwrap().unwrap();
    let (h, payload) = &frames[0];
    assert_eq!(h.kind, proto::FrameKind::Request);
    assert_eq!(h.bulk_len as usize, 16 + 3901);
    assert_eq!(&payload[..8], &region.key().to_le_bytes());
    assert_eq!(&payload[8..16], &1000u64.to_le_bytes());
    assert_eq!(&payload[16..], &pattern(7, 200_000)[1000..4901]);
    let (h, payload) = &frames[1];
    assert_eq!((h.kind, h.bulk_len), (proto::FrameKind::Request, 0));
    assert!(payload.is_empty());
}

/// A server takes the bytes a request carried for the range it names, whole, and checks them
/// against the descriptor's crc32c: bytes that do not match it are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_write_carried_by_its_request_is_checked_against_its_descriptor() {
    let (_srv, nid) = selftest_server().await;
    let client = TcpEndpoint::client(cli_cfg());
    let region = client.register(pattern(3, 8192)).unwrap();
    for (offset, len) in [(0u64, 1u32), (5, 3901), (0, 8192)] {
        let desc = region.desc(offset, len, true).unwrap();
        let done = call(&client, &nid, &BulkWrite { desc: desc.clone() }, T)
            .await
            .unwrap();
        assert_eq!(done.bytes, u64::from(len));
        assert_eq!(Some(done.crc32c), desc.crc32c);
    }
    let mut desc = region.desc(0, 4096, true).unwrap();
    desc.crc32c = desc.crc32c.map(|c| c ^ 1);
    let err = call(&client, &nid, &BulkWrite { desc }, T)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
}
