//! The storage service over real TCP, with a target on the crash-simulating engine.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lnet::auth::capability::{READ, WRITE};
use lnet::auth::{CapabilityKey, KeyFile, Keyring, Security};
use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError, Transport};
use oss::engine::mem::MemEngine;
use oss::engine::Engine;
use oss::service::OssService;
use oss::Target;
use proto::ost::*;
use proto::{BulkDesc, Fid, Nid, StatusCode};

const T: Duration = Duration::from_secs(10);

/// A storage server with one target, authenticating with `key`, and an endpoint of its own
/// cluster acting as a server (the MDS's role).
async fn oss_with(key: &KeyFile) -> (TcpEndpoint, Nid, TcpEndpoint) {
    let engine: Arc<dyn Engine> = Arc::new(MemEngine::new(1 << 30));
    Target::format(&engine, Path::new("/ost7"), 107, Some(7))
        .await
        .unwrap();
    Target::bind(&engine, Path::new("/ost7"), 7, 0xf5)
        .await
        .unwrap();
    let target = Arc::new(Target::open(engine, Path::new("/ost7")).await.unwrap());
    let keys = Arc::new(Keyring::new(key));
    let server = TcpEndpoint::bind(
        "127.0.0.1:0".parse().unwrap(),
        OssService::new([target], CapabilityKey::of(&keys), None),
        TcpConfig {
            security: Security::server(keys.clone(), false).unwrap(),
            ..TcpConfig::default()
        },
    )
    .await
    .unwrap();
    let nid = server.nid();
    let as_server = TcpEndpoint::client(TcpConfig {
        security: Security::server(keys, false).unwrap(),
        ..TcpConfig::default()
    });
    (server, nid, as_server)
}

async fn oss() -> (TcpEndpoint, Nid, TcpEndpoint) {
    oss_with(&KeyFile::generate().unwrap()).await
}

fn code(e: NetError) -> StatusCode {
    match e {
        NetError::Remote { err, .. } => err.code,
        other => panic!("expected an error reply, got {other}"),
    }
}

// Long by design: one server through writes, reads and their edge cases, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_written_and_read_through_bulk_transfers() {
    let (_s, nid, c) = oss().await;
    let created = call(
        &c,
        &nid,
        &OstPrecreate {
            target: 7,
            count: 4,
            mdt: 0,
        },
        T,
    )
    .await
    .unwrap();
    let fid = created.first;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let src = c.register(data.clone()).unwrap();
    let w = OstWrite {
        capa: None,
        target: 7,
        fid,
        offset: 1000,
        desc: src.desc(0, data.len() as u32, true).unwrap(),
        sync: true,
        stamp: Default::default(),
    };
    assert_eq!(
        call(&c, &nid, &w, T).await.unwrap().size,
        1000 + data.len() as u64
    );

    let dst = c.register(vec![0u8; 4 << 20]).unwrap();
    let r = OstRead {
        capa: None,
        target: 7,
        fid,
        offset: 1000,
        desc: dst.desc(0, 4 << 20, false).unwrap(),
    };
    let done = call(&c, &nid, &r, T).await.unwrap();
    assert_eq!(
        done.bytes as usize,
        data.len(),
        "short read at the end of the object"
    );
    assert_eq!(
        dst.read(0, data.len() as u64).unwrap().as_slice(),
        &data[..]
    );

    let truncate = |size| OstTruncate {
        capa: None,
        target: 7,
        fid,
        size,
        stamp: WriteStamp::default(),
    };
    call(&c, &nid, &truncate(10), T).await.unwrap();
    assert_eq!(
        call(
            &c,
            &nid,
            &OstGetattr {
                target: 7,
                fid,
                capa: None
            },
            T
        )
        .await
        .unwrap()
        .size,
        10
    );
    // Grown into a hole: a read sends the block with data and none of the hole's zeros; the
    // object's size says how far the zeros go.
    let w = OstWrite {
        capa: None,
        target: 7,
        fid,
        offset: 0,
        desc: src.desc(0, 10, true).unwrap(),
        sync: false,
        stamp: Default::default(),
    };
    call(&c, &nid, &w, T).await.unwrap();
    call(&c, &nid, &truncate(3 << 20), T).await.unwrap();
    let dst = c.register(vec![0xeeu8; 4 << 20]).unwrap();
    let r = OstRead {
        capa: None,
        target: 7,
        fid,
        offset: 0,
        desc: dst.desc(0, 4 << 20, false).unwrap(),
    };
    let done = call(&c, &nid, &r, T).await.unwrap();
    assert_eq!((done.bytes, done.size), (4096, 3 << 20));
    let head = dst.read(0, 4096).unwrap();
    assert_eq!(&head.as_slice()[..10], &data[..10]);
    assert!(head.as_slice()[10..].iter().all(|&b| b == 0));
    // Past what was placed, the region is as it was: the client fills the zeros.
    assert_eq!(dst.read(4096, 1).unwrap().as_slice(), &[0xee]);
    call(&c, &nid, &truncate(10), T).await.unwrap();
    call(
        &c,
        &nid,
        &OstPunch {
            capa: None,
            target: 7,
            fid,
            offset: 0,
            len: 5,
            stamp: WriteStamp::default(),
        },
        T,
    )
    .await
    .unwrap();
    call(
        &c,
        &nid,
        &OstSync {
            target: 7,
            fid,
            capa: None,
        },
        T,
    )
    .await
    .unwrap();
    let space = call(&c, &nid, &OstStatfs { target: 7 }, T).await.unwrap();
    assert!(space.index == 7 && space.free < space.total);
    call(&c, &nid, &OstDestroy { target: 7, fid }, T)
        .await
        .unwrap();
    let err = call(
        &c,
        &nid,
        &OstGetattr {
            target: 7,
            fid,
            capa: None,
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::NotFound);

    // Many at once: the ones destroyed before (or never handed out) come back as missing.
    let sibling = Fid::new(fid.seq, fid.oid + 1, 0);
    let unknown = Fid::new(fid.seq, 999_999, 0);
    let r = OstDestroyMany {
        target: 7,
        fids: vec![fid, sibling, unknown],
    };
    let got = call(&c, &nid, &r, T).await.unwrap();
    assert_eq!(got.missing, vec![fid, unknown]);
    let err = call(
        &c,
        &nid,
        &OstGetattr {
            target: 7,
            fid: sibling,
            capa: None,
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::NotFound);
    let too_many = OstDestroyMany {
        target: 7,
        fids: vec![sibling; proto::ost::MAX_DESTROY_MANY + 1],
    };
    let err = call(&c, &nid, &too_many, T).await.unwrap_err();
    assert_eq!(code(err), StatusCode::Invalid);
}

// Long by design: one table of bad requests against one server, then a check that nothing was
// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_store_nothing() {
    let (_s, nid, c) = oss().await;
    let fid = call(
        &c,
        &nid,
        &OstPrecreate {
            target: 7,
            count: 1,
            mdt: 0,
        },
        T,
    )
    .await
    .unwrap()
    .first;
    let src = c.register(vec![9u8; 8192]).unwrap();
    let good = src.desc(0, 8192, true).unwrap();

    // A write whose checksum does not match the data.
    let mut bad = good.clone();
    bad.crc32c = bad.crc32c.map(|c| c ^ 1);
    let err = call(
        &c,
        &nid,
        &OstWrite {
            capa: None,
            target: 7,
            fid,
            offset: 0,
            desc: bad,
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::Checksum);
    // A descriptor past the region, an unknown key.
    let past = BulkDesc {
        offset: 4096,
        ..good.clone()
    };
    let err = call(
        &c,
        &nid,
        &OstWrite {
            capa: None,
            target: 7,
            fid,
            offset: 0,
            desc: past,
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::Bulk);
    let stranger = BulkDesc {
        key: good.key ^ 7,
        ..good.clone()
    };
    let err = call(
        &c,
        &nid,
        &OstWrite {
            capa: None,
            target: 7,
            fid,
            offset: 0,
            desc: stranger,
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::Bulk);
    assert_eq!(
        call(
            &c,
            &nid,
            &OstGetattr {
                target: 7,
                fid,
                capa: None
            },
            T
        )
        .await
        .unwrap()
        .size,
        0,
        "nothing was stored"
    );
    // A write without a checksum (from GPU memory the client cannot read) is checksummed on
    // receipt and stored.
    let unchecked = BulkDesc {
        crc32c: None,
        ..good.clone()
    };
    let stored = call(
        &c,
        &nid,
        &OstWrite {
            capa: None,
            target: 7,
            fid,
            offset: 0,
            desc: unchecked,
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap();
    assert_eq!(stored.size, 8192);

    // Offsets past the limits, unknown targets and objects, absurd precreates.
    let err = call(
        &c,
        &nid,
        &OstWrite {
            capa: None,
            target: 7,
            fid,
            offset: u64::MAX - 10,
            desc: good.clone(),
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::Invalid);
    let err = call(
        &c,
        &nid,
        &OstWrite {
            capa: None,
            target: 8,
            fid,
            offset: 0,
            desc: good.clone(),
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::NotFound);
    let ghost = Fid::new(fid.seq, fid.oid + 100, 0);
    let err = call(
        &c,
        &nid,
        &OstWrite {
            capa: None,
            target: 7,
            fid: ghost,
            offset: 0,
            desc: good,
            sync: false,
            stamp: Default::default(),
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::NotFound);
    let err = call(
        &c,
        &nid,
        &OstPrecreate {
            target: 7,
            count: u32::MAX,
            mdt: 0,
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::Invalid);
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A client of the cluster (client key) reaches objects only with the MDS's capability for
/// that very object, with the rights it grants, before it expires; it cannot create or destroy
/// objects at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_io_needs_a_valid_capability_and_objects_are_for_servers_to_make() {
    let key = KeyFile::generate().unwrap();
    let (_s, nid, server) = oss_with(&key).await;
    let created = call(
        &server,
        &nid,
        &OstPrecreate {
            target: 7,
            count: 2,
            mdt: 0,
        },
        T,
    )
    .await
    .unwrap();
    let (fid, other) = (
        created.first,
        Fid::new(created.first.seq, created.first.oid + 1, 0),
    );
    let client = TcpEndpoint::client(TcpConfig {
        security: Security::client(Arc::new(Keyring::new(&key.client_key())), false),
        ..TcpConfig::default()
    });
    let denied =
        |e: NetError| assert_eq!(code(e), StatusCode::Fs(proto::FsErrorKind::AccessDenied));
    let not_permitted =
        |e: NetError| assert_eq!(code(e), StatusCode::Fs(proto::FsErrorKind::NotPermitted));
    // Servers' business.
    not_permitted(
        call(
            &client,
            &nid,
            &OstPrecreate {
                target: 7,
                count: 1,
                mdt: 0,
            },
            T,
        )
        .await
        .unwrap_err(),
    );
    not_permitted(
        call(&client, &nid, &OstDestroy { target: 7, fid }, T)
            .await
            .unwrap_err(),
    );
    not_permitted(
        call(
            &client,
            &nid,
            &OstDestroyMany {
                target: 7,
                fids: vec![fid],
            },
            T,
        )
        .await
        .unwrap_err(),
    );
    not_permitted(
        call(
            &client,
            &nid,
            &OstDestroyAbove {
                target: 7,
                mdt: 0,
                keep_up_to: 0,
                run: 1,
                fs: 0xf5,
            },
            T,
        )
        .await
        .unwrap_err(),
    );

    let signer = CapabilityKey::of(&Keyring::new(&key)).unwrap();
    let grant = signer.grant([(7, fid)], READ | WRITE, now() + 600);
    let good = grant.for_object(7, fid).unwrap();
    let data = vec![0x5au8; 8192];
    let src = client.register(data.clone()).unwrap();
    let write = |capa| OstWrite {
        target: 7,
        fid,
        offset: 0,
        desc: src.desc(0, 8192, true).unwrap(),
        sync: false,
        stamp: WriteStamp::default(),
        capa,
    };
    // Missing, forged, for another object, expired, or without the right: refused.
    denied(call(&client, &nid, &write(None), T).await.unwrap_err());
    let mut forged = good;
    forged.mac[0] ^= 1;
    denied(
        call(&client, &nid, &write(Some(forged)), T)
            .await
            .unwrap_err(),
    );
    let widened = proto::capa::Capability {
        expiry: good.expiry + 3600,
        ..good
    };
    denied(
        call(&client, &nid, &write(Some(widened)), T)
            .await
            .unwrap_err(),
    );
    let for_other = signer
        .grant([(7, other)], READ | WRITE, now() + 600)
        .for_object(7, other)
        .unwrap();
    denied(
        call(&client, &nid, &write(Some(for_other)), T)
            .await
            .unwrap_err(),
    );
    let expired = signer
        .grant([(7, fid)], READ | WRITE, now() - 1)
        .for_object(7, fid)
        .unwrap();
    denied(
        call(&client, &nid, &write(Some(expired)), T)
            .await
            .unwrap_err(),
    );
    let read_only = signer
        .grant([(7, fid)], READ, now() + 600)
        .for_object(7, fid)
        .unwrap();
    denied(
        call(&client, &nid, &write(Some(read_only)), T)
            .await
            .unwrap_err(),
    );
    let punch = OstPunch {
        target: 7,
        fid,
        offset: 0,
        len: 4096,
        stamp: WriteStamp::default(),
        capa: Some(read_only),
    };
    denied(call(&client, &nid, &punch, T).await.unwrap_err());
    let stranger = CapabilityKey::of(&Keyring::new(&KeyFile::generate().unwrap())).unwrap();
    let foreign = stranger
        .grant([(7, fid)], READ | WRITE, now() + 600)
        .for_object(7, fid)
        .unwrap();
    denied(
        call(&client, &nid, &write(Some(foreign)), T)
            .await
            .unwrap_err(),
    );
    // Nothing refused reached the object.
    let size = call(
        &server,
        &nid,
        &OstGetattr {
            target: 7,
            fid,
            capa: None,
        },
        T,
    )
    .await
    .unwrap()
    .size;
    assert_eq!(size, 0);

    // The MDS's capability works for what it grants.
    call(&client, &nid, &write(Some(good)), T).await.unwrap();
    let dst = client.register(vec![0u8; 8192]).unwrap();
    let read = OstRead {
        target: 7,
        fid,
        offset: 0,
        desc: dst.desc(0, 8192, false).unwrap(),
        capa: Some(read_only),
    };
    assert_eq!(call(&client, &nid, &read, T).await.unwrap().bytes, 8192);
    assert_eq!(dst.read(0, 8192).unwrap().as_slice(), &data[..]);
    let read_other = OstGetattr {
        target: 7,
        fid: other,
        capa: Some(read_only),
    };
    denied(call(&client, &nid, &read_other, T).await.unwrap_err());
    // A request's work is bounded: a punch past the limit is refused, not carried out.
    let huge = OstPunch {
        target: 7,
        fid,
        offset: 0,
        len: MAX_PUNCH + 1,
        stamp: WriteStamp::default(),
        capa: Some(good),
    };
    let err = call(&client, &nid, &huge, T).await.unwrap_err();
    assert_eq!(code(err), StatusCode::Invalid);
}
