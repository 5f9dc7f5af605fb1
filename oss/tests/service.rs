//! The storage service over real TCP, with a target on the crash-simulating engine.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lnet::tcp::{TcpConfig, TcpEndpoint};
use lnet::{call, NetError, Transport};
use oss::engine::mem::MemEngine;
use oss::engine::Engine;
use oss::service::OssService;
use oss::Target;
use proto::ost::*;
use proto::{BulkDesc, Fid, Nid, StatusCode};

const T: Duration = Duration::from_secs(10);

async fn oss() -> (TcpEndpoint, Nid, TcpEndpoint) {
    let engine: Arc<dyn Engine> = Arc::new(MemEngine::new(1 << 30));
    Target::format(&engine, Path::new("/ost7"), 107, Some(7))
        .await
        .unwrap();
    let target = Arc::new(Target::open(engine, Path::new("/ost7")).await.unwrap());
    let server = TcpEndpoint::bind(
        "127.0.0.1:0".parse().unwrap(),
        OssService::new([target]),
        TcpConfig::default(),
    )
    .await
    .unwrap();
    let nid = server.nid();
    (server, nid, TcpEndpoint::client(TcpConfig::default()))
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
        },
        T,
    )
    .await
    .unwrap();
    let fid = created.first;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let src = c.register(data.clone()).unwrap();
    let w = OstWrite {
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

    call(
        &c,
        &nid,
        &OstTruncate {
            target: 7,
            fid,
            size: 10,
        },
        T,
    )
    .await
    .unwrap();
    assert_eq!(
        call(&c, &nid, &OstGetattr { target: 7, fid }, T)
            .await
            .unwrap()
            .size,
        10
    );
    call(
        &c,
        &nid,
        &OstPunch {
            target: 7,
            fid,
            offset: 0,
            len: 5,
        },
        T,
    )
    .await
    .unwrap();
    call(&c, &nid, &OstSync { target: 7, fid }, T)
        .await
        .unwrap();
    let space = call(&c, &nid, &OstStatfs { target: 7 }, T).await.unwrap();
    assert!(space.index == 7 && space.free < space.total);
    call(&c, &nid, &OstDestroy { target: 7, fid }, T)
        .await
        .unwrap();
    let err = call(&c, &nid, &OstGetattr { target: 7, fid }, T)
        .await
        .unwrap_err();
    assert_eq!(code(err), StatusCode::NotFound);
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
    // A write without a checksum, a descriptor past the region, an unknown key.
    let unchecked = BulkDesc {
        crc32c: None,
        ..good.clone()
    };
    let err = call(
        &c,
        &nid,
        &OstWrite {
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
    .unwrap_err();
    assert_eq!(code(err), StatusCode::BadRequest);
    let past = BulkDesc {
        offset: 4096,
        ..good.clone()
    };
    let err = call(
        &c,
        &nid,
        &OstWrite {
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
        call(&c, &nid, &OstGetattr { target: 7, fid }, T)
            .await
            .unwrap()
            .size,
        0,
        "nothing was stored"
    );

    // Offsets past the limits, unknown targets and objects, absurd precreates.
    let err = call(
        &c,
        &nid,
        &OstWrite {
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
        },
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), StatusCode::Invalid);
}
