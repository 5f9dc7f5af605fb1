//! The store's promises against a disk that crashes, tears writes and stalls: a reply that says
//! success (a resend's too) means the change is durable; nothing is destroyed before the change
//! that frees it is durable; a record that cannot be journaled is refused before anything
//! changes; only a torn tail at the very end of the journal is cut.

use std::sync::Arc;
use std::time::Duration;

use mds::disk::{MemDisk, MetaDisk};
use mds::namespace::{Creds, Kind, Mutation, ReqId, ROOT};
use mds::store::{Change, Store};
use proto::layout::{Component, Layout, StripeCount, StripeObject};
use proto::{Fid, FsErrorKind};

fn create(name: &str, layout: Option<Layout>) -> Mutation {
    Mutation::Create {
        parent: ROOT,
        name: name.as_bytes().to_vec(),
        kind: Kind::File,
        mode: 0o644,
        exclusive: true,
        target: vec![],
        layout,
    }
}

/// A layout naming `stripes` objects per component on target 0.
fn layout(components: u64, stripes: u32, first_oid: u32) -> Layout {
    let size = 1 << 20;
    let mut oid = first_oid;
    let components = (0..components)
        .map(|i| {
            let mut c = Component::raid0(StripeCount::Count(stripes), size);
            c.start = i * size;
            c.end = if i + 1 == components {
                proto::layout::EOF
            } else {
                (i + 1) * size
            };
            c.objects = (0..stripes)
                .map(|_| {
                    oid += 1;
                    StripeObject {
                        target: 0,
                        fid: Fid::new(proto::fid::OST_SEQ_BASE, oid, 0),
                    }
                })
                .collect();
            c
        })
        .collect();
    Layout {
        generation: 1,
        components,
    }
}

fn open(disk: &Arc<MemDisk>) -> Store {
    Store::open_on(disk.clone() as Arc<dyn MetaDisk>, 1 << 30).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_is_answered_only_once_its_change_is_durable() {
    let disk = Arc::new(MemDisk::new());
    let store = Arc::new(open(&disk));
    let req = Some(ReqId { client: 9, seq: 1 });
    disk.hold_syncs(true);
    let first = {
        let s = store.clone();
        tokio::spawn(async move {
            s.apply(Change::new(create("a", None), Creds::root()).request(req))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The first attempt is applied in memory, its commit stalled: the resend must wait too.
    let resend = tokio::time::timeout(
        Duration::from_millis(300),
        store.decide(&create("a", None), &Creds::root(), req, 0),
    )
    .await;
    assert!(
        resend.is_err(),
        "a resend was answered before its change was durable"
    );
    // The power goes before the commit: neither attempt may have said success.
    disk.crash(None);
    assert!(first.await.unwrap().is_err());
    drop(store);
    let store = open(&disk);
    store.read(|ns| assert!(ns.lookup(ROOT, b"a", &Creds::root()).is_err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_not_destroyed_before_their_removal_is_durable() {
    let disk = Arc::new(MemDisk::new());
    let store = Arc::new(open(&disk));
    store
        .apply(Change::new(
            create("ckpt", Some(layout(1, 4, 0))),
            Creds::root(),
        ))
        .await
        .unwrap();
    disk.hold_syncs(true);
    let unlink = {
        let s = store.clone();
        tokio::spawn(async move {
            let m = Mutation::Unlink {
                parent: ROOT,
                name: b"ckpt".to_vec(),
                dir: false,
            };
            s.apply(Change::new(m, Creds::root())).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(store.read(|ns| ns.lookup(ROOT, b"ckpt", &Creds::root()).is_err()));
    let doomed = tokio::time::timeout(Duration::from_secs(2), store.doomed(100, |_| false));
    assert!(
        doomed
            .await
            .expect("doomed waits briefly, then answers")
            .is_empty(),
        "objects were offered for destruction while their unlink was not durable"
    );
    disk.crash(None);
    assert!(unlink.await.unwrap().is_err());
    assert!(store.doomed(100, |_| false).await.is_empty());
    drop(store);
    let store = open(&disk);
    store.read(|ns| assert!(ns.lookup(ROOT, b"ckpt", &Creds::root()).is_ok()));
    assert!(store.doomed(100, |_| false).await.is_empty());
}

#[tokio::test]
async fn a_record_too_large_to_journal_is_refused_and_later_records_survive() {
    let dir = std::env::temp_dir().join(format!("lode-durability-big-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::open(&dir, 1 << 30).unwrap();
    store
        .apply(Change::new(create("before", None), Creds::root()))
        .await
        .unwrap();
    // 64 components of 2000 objects: every part valid, the whole past the largest record.
    let err = store
        .apply(Change::new(
            create("huge", Some(layout(64, 2000, 0))),
            Creds::root(),
        ))
        .await
        .unwrap_err();
    match &err {
        mds::store::StoreError::Namespace(e) => assert_eq!(e.kind, FsErrorKind::TooBig),
        other => panic!("{other}"),
    }
    store.read(|ns| assert!(ns.lookup(ROOT, b"huge", &Creds::root()).is_err()));
    store
        .apply(Change::new(create("after", None), Creds::root()))
        .await
        .unwrap();
    drop(store);
    let store = Store::open(&dir, 1 << 30).unwrap();
    store.read(|ns| {
        assert!(ns.lookup(ROOT, b"before", &Creds::root()).is_ok());
        assert!(ns.lookup(ROOT, b"after", &Creds::root()).is_ok());
        assert!(ns.check().is_empty());
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn damage_in_the_middle_of_the_journal_stops_recovery_instead_of_cutting() {
    let disk = Arc::new(MemDisk::new());
    let store = open(&disk);
    for i in 0..10 {
        store
            .apply(Change::new(create(&format!("f{i}"), None), Creds::root()))
            .await
            .unwrap();
    }
    drop(store);
    let mut raw = disk.read("journal").unwrap().unwrap();
    // Flip one byte in the body of the third batch.
    let mut at = 16;
    for _ in 0..2 {
        at += 24 + u32::from_le_bytes(raw[at + 4..at + 8].try_into().unwrap()) as usize;
    }
    raw[at + 30] ^= 0x40;
    disk.replace("journal", &raw).unwrap();
    let err = Store::open_on(disk.clone() as Arc<dyn MetaDisk>, 1 << 30)
        .err()
        .expect("recovery went on past damage in the middle");
    let msg = err.to_string();
    assert!(msg.contains("damage in the middle"), "{msg}");
    assert!(msg.contains(&format!("bytes {at}..")), "{msg}");
}

#[tokio::test]
async fn every_acknowledged_change_survives_a_power_cut_that_tears_the_last_write() {
    for seed in 0..40u64 {
        let disk = Arc::new(MemDisk::new());
        let store = Arc::new(open(&disk));
        let mut acked = vec![];
        for i in 0..12 {
            let name = format!("f{i}");
            store
                .apply(Change::new(create(&name, None), Creds::root()))
                .await
                .unwrap();
            acked.push(name);
        }
        // One change whose commit is under way when the power goes.
        disk.hold_syncs(true);
        let s = store.clone();
        let late = tokio::spawn(async move {
            s.apply(Change::new(create("late", None), Creds::root()))
                .await
        });
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        disk.crash(Some(seed));
        let late = late.await.unwrap();
        drop(store);
        let store = open(&disk);
        store.read(|ns| {
            for name in &acked {
                assert!(
                    ns.lookup(ROOT, name.as_bytes(), &Creds::root()).is_ok(),
                    "seed {seed}: {name} lost"
                );
            }
            if late.is_ok() {
                assert!(ns.lookup(ROOT, b"late", &Creds::root()).is_ok());
            }
            assert!(ns.check().is_empty());
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inode_number_seen_before_a_power_cut_is_never_given_again() {
    let disk = Arc::new(MemDisk::new());
    let store = open(&disk);
    store
        .apply(Change::new(create("kept", None), Creds::root()))
        .await
        .unwrap();
    // Applied and answered before it is durable: another client may have opened it by its
    // FID. The power goes before the commit, and the create is lost with it.
    disk.hold_syncs(true);
    let lost = store
        .apply_behind(Change::new(create("lost", None), Creds::root()))
        .unwrap()
        .applied
        .inode
        .unwrap()
        .fid;
    store.halt();
    disk.crash(None);
    drop(store);
    disk.hold_syncs(false);
    let store = open(&disk);
    store.read(|ns| assert!(ns.lookup(ROOT, b"lost", &Creds::root()).is_err()));
    // Recovery over (no client to wait for): new inodes start past every number given out.
    store.skip_given_out();
    let new = store
        .apply(Change::new(create("new", None), Creds::root()))
        .await
        .unwrap()
        .inode
        .unwrap()
        .fid;
    assert_ne!(new, lost, "a lost file's FID was given to a new file");
    assert!(new.oid > lost.oid);
    // The skip is journaled: after another restart the new file keeps its FID, and numbers
    // go on above it.
    drop(store);
    let store = open(&disk);
    store.read(|ns| {
        assert_eq!(ns.lookup(ROOT, b"new", &Creds::root()).unwrap().fid, new);
        assert!(ns.next_inode() > new.oid);
    });
}

#[tokio::test]
async fn a_damaged_mark_of_inode_numbers_stops_the_open() {
    let disk = Arc::new(MemDisk::new());
    let store = open(&disk);
    store
        .apply(Change::new(create("a", None), Creds::root()))
        .await
        .unwrap();
    drop(store);
    let mut raw = disk.read("inomark").unwrap().expect("the mark is written");
    raw[9] ^= 0x40;
    disk.replace("inomark", &raw).unwrap();
    let err = Store::open_on(disk.clone() as Arc<dyn MetaDisk>, 1 << 30)
        .err()
        .expect("a damaged mark is refused");
    assert!(err.to_string().contains("inomark"), "{err}");
}
