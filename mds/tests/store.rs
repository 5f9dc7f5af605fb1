//! The durable namespace: what is acknowledged is recovered, a torn journal tail is cut, and
//! snapshots replace the journal without losing or repeating anything.

use std::sync::Arc;

use mds::namespace::{Creds, Kind, Mutation, ROOT};
use mds::store::{Change, Store};

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lode-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn create(name: String) -> Mutation {
    Mutation::Create {
        parent: ROOT,
        name: name.into_bytes(),
        kind: Kind::File,
        mode: 0o644,
        exclusive: true,
        target: vec![],
        layout: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_mutations_are_all_recovered() {
    let d = dir("concurrent");
    let store = Arc::new(Store::open(&d, 1 << 30).unwrap());
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move {
                s.apply(Change::new(create(format!("f{i}")), Creds::root()))
                    .await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let err = store
        .apply(Change::new(create("f7".into()), Creds::root()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("exists"), "{err}");
    let before = store.read(|ns| ns.clone());
    drop(store);
    let again = Store::open(&d, 1 << 30).unwrap();
    assert_eq!(again.recovered_records, 300);
    again.read(|ns| {
        assert!(ns == &before, "the recovered namespace differs");
        assert!(ns.check().is_empty());
    });
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn a_torn_journal_tail_is_cut_and_the_rest_kept() {
    let d = dir("torn");
    let store = Store::open(&d, 1 << 30).unwrap();
    for i in 0..5 {
        store
            .apply(Change::new(create(format!("f{i}")), Creds::root()))
            .await
            .unwrap();
    }
    drop(store);
    // A batch that was being written when the power went: its header, part of its body.
    let path = d.join("journal");
    let raw = std::fs::read(&path).unwrap();
    let end = journal_end(&raw);
    assert!(
        raw[end..].iter().all(|b| *b == 0),
        "zeros are laid ahead of the records"
    );
    let mut raw = raw[..end].to_vec();
    raw.extend_from_slice(b"LJB2\x40\0\0\0\x06\0\0\0\0\0\0\0\x01\0\0\0");
    std::fs::write(&path, &raw).unwrap();
    let store = Store::open(&d, 1 << 30).unwrap();
    assert_eq!((store.recovered_records, store.torn_bytes), (5, 17));
    store
        .apply(Change::new(create("after".into()), Creds::root()))
        .await
        .unwrap();
    drop(store);
    let store = Store::open(&d, 1 << 30).unwrap();
    assert_eq!((store.recovered_records, store.torn_bytes), (6, 0));
    store.read(|ns| assert!(ns.lookup(ROOT, b"after", &Creds::root()).is_ok()));
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn snapshots_replace_the_journal_without_loss() {
    let d = dir("snapshot");
    let store = Store::open(&d, 4096).unwrap();
    for i in 0..200 {
        store
            .apply(Change::new(create(format!("file-{i:04}")), Creds::root()))
            .await
            .unwrap();
    }
    let before = store.read(|ns| ns.clone());
    drop(store);
    assert!(d.join("snapshot").exists());
    let raw = std::fs::read(d.join("journal")).unwrap();
    assert!(journal_end(&raw) < 8192, "the journal was emptied");
    let store = Store::open(&d, 4096).unwrap();
    store.read(|ns| assert!(ns == &before, "the recovered namespace differs"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_damaged_snapshot_is_refused_not_ignored() {
    let d = dir("badsnap");
    std::fs::write(d.join("snapshot"), b"LODESNP\0garbage garbage garbage").unwrap();
    assert!(Store::open(&d, 4096).is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn a_resent_request_is_answered_not_redone_even_after_a_restart() {
    use mds::namespace::ReqId;
    let d = dir("resend");
    let store = Store::open(&d, 1 << 30).unwrap();
    let req = Some(ReqId { client: 77, seq: 1 });
    let first = store
        .apply(Change::new(create("once".into()), Creds::root()).request(req))
        .await
        .unwrap();
    let again = store
        .apply(Change::new(create("once".into()), Creds::root()).request(req))
        .await
        .unwrap();
    assert_eq!(
        first.inode.as_ref().unwrap().fid,
        again.inode.as_ref().unwrap().fid
    );
    // The same mutation under a new request id is a new request: it fails as it should.
    let fresh = Some(ReqId { client: 77, seq: 2 });
    assert!(store
        .apply(Change::new(create("once".into()), Creds::root()).request(fresh))
        .await
        .is_err());
    drop(store);
    let store = Store::open(&d, 1 << 30).unwrap();
    let after = store
        .apply(Change::new(create("once".into()), Creds::root()).request(req))
        .await
        .unwrap();
    assert_eq!(
        after.inode.unwrap().fid,
        first.inode.unwrap().fid,
        "the reply is remembered across a restart"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn a_whole_batch_resent_is_answered_as_first_time_and_replies_go_only_when_acknowledged() {
    use mds::namespace::{Decision, ReqId};
    let d = dir("resend-batch");
    let store = Store::open(&d, 1 << 30).unwrap();
    let req = |seq| Some(ReqId { client: 78, seq });
    // A batch of 512 creates and an unlink-then-create of one name, all answered while
    // their replies were lost on the way.
    for seq in 1..=512u64 {
        store
            .apply(Change::new(create(format!("f{seq}")), Creds::root()).request(req(seq)))
            .await
            .unwrap();
    }
    let unlink = Mutation::Unlink {
        parent: ROOT,
        name: b"f1".to_vec(),
        dir: false,
    };
    store
        .apply(Change::new(unlink.clone(), Creds::root()).request(req(513)))
        .await
        .unwrap();
    let again = store
        .apply(Change::new(create("f1".into()), Creds::root()).request(req(514)))
        .await
        .unwrap();
    // The whole batch comes again: every change is answered as the first time, none redone
    // (an unlink redone would remove the new f1; a create redone would say EEXIST).
    for seq in 1..=514u64 {
        let m = match seq {
            513 => unlink.clone(),
            514 => create("f1".into()),
            s => create(format!("f{s}")),
        };
        assert!(
            matches!(
                store.decide(&m, &Creds::root(), req(seq), 0).await.unwrap(),
                Decision::Replied(_)
            ),
            "request {seq} would be carried out twice"
        );
    }
    let f1 = store.read(|ns| ns.lookup(ROOT, b"f1", &Creds::root()).unwrap().fid);
    assert_eq!(f1, again.inode.unwrap().fid, "the new f1 is there");
    // The client says it had the replies below 514: only the last one is kept.
    let next = create("next".into());
    assert!(matches!(
        store
            .decide(&next, &Creds::root(), req(515), 514)
            .await
            .unwrap(),
        Decision::Applies
    ));
    assert_eq!(store.read(|ns| ns.replies_kept()), 1);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Where the batches of a journal end (the header, then magic, length, seq, count, crc, body).
fn journal_end(raw: &[u8]) -> usize {
    let mut at = 16;
    while at + 24 <= raw.len() && &raw[at..at + 4] == b"LJB2" {
        at += 24 + u32::from_le_bytes(raw[at + 4..at + 8].try_into().unwrap()) as usize;
    }
    at
}
