//! Encryption at rest with real processes (an MDS and two storage servers): what is written in
//! an encrypted directory is nowhere in clear on any server's disk (and the same search finds
//! what is written in clear, so it can fail); every kind of write, truncate and read matches a
//! model byte for byte; without the key (or with another) names are shown encrypted and
//! contents are ENOKEY; and the MDS keeps a tree's edge whatever a client with the client key
//! sends.

use std::path::Path;
use std::time::{Duration, Instant};

use client::crypt::MasterKey;
use client::{Client, OpenOptions};
use lode_tests::{client_riding_restarts as connect, mds_of, oss_of, scratch, Server};
use proto::md::Mutation;
use proto::FsErrorKind;

/// Bytes that differ at every offset and from seed to seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An MDS, two storage servers and a client once storage is in service.
async fn cluster(name: &str) -> (std::path::PathBuf, Server, Vec<Server>, Client) {
    let root = scratch(name);
    let m = mds_of(&root);
    let oss = vec![
        oss_of(&root.join("oss0"), &m.nid),
        oss_of(&root.join("oss1"), &m.nid),
    ];
    let c = connect(&m.nid).await;
    let start = Instant::now();
    while c
        .targets()
        .await
        .map_or(true, |t| t.iter().filter(|t| t.up).count() < 2)
    {
        assert!(start.elapsed() < Duration::from_secs(30), "no storage");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (root, m, oss, c)
}

async fn write(c: &Client, path: &str, data: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(c, path)
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    f.write_at(0, data).await.unwrap();
    f.fsync().await.unwrap();
    f.close().await.unwrap();
}

async fn read(c: &Client, path: &str) -> Result<Vec<u8>, client::ClientError> {
    let f = OpenOptions::new().read(true).open(c, path).await?;
    let size = f.size().await?;
    let mut buf = vec![0u8; size as usize + 100];
    let n = f.read_at(0, &mut buf).await?;
    buf.truncate(n);
    f.close().await?;
    Ok(buf)
}

/// Every file below `dir`, read whole.
fn every_file(dir: &Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            every_file(&p, out);
        } else if t.is_file() {
            if let Ok(b) = std::fs::read(&p) {
                out.push((p, b));
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len()
        && (0..=hay.len() - needle.len())
            .filter(|&i| hay[i] == needle[0])
            .any(|i| &hay[i..i + needle.len()] == needle)
}

/// Where on the servers' disks `needle` is.
fn found_in(files: &[(std::path::PathBuf, Vec<u8>)], needle: &[u8]) -> Vec<String> {
    files
        .iter()
        .filter(|(_, b)| contains(b, needle))
        .map(|(p, _)| p.display().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_encrypted_directory_holds_is_on_no_disk_in_clear_and_what_a_clear_one_holds_is() {
    let (root, mds, _oss, c) = cluster("crypt-disks").await;
    for d in ["/secret", "/plain"] {
        c.mkdir(d, 0o755).await.unwrap();
    }
    assert!(c.crypt_policy("/secret").await.unwrap().is_none());
    // The key is given to the client as bytes; the policy names it by identifier.
    let raw = pattern(77, 64);
    let k = MasterKey::new(&raw).unwrap();
    let p = c.crypt_set("/secret", &k).await.unwrap();
    assert_eq!(p.key_id, k.id());
    c.crypt_add_key(k);
    // Striped over both servers, and with the first 64 KiB kept by the MDS.
    for top in ["/secret", "/plain"] {
        c.mkdir(&format!("{top}/striped"), 0o755).await.unwrap();
        c.setstripe(
            &format!("{top}/striped"),
            client::raid0(Some(2), 64 << 10).unwrap(),
        )
        .await
        .unwrap();
        c.mkdir(&format!("{top}/dom"), 0o755).await.unwrap();
        let opts: Vec<String> = "-E 64K -L mdt -E -1 -c -1"
            .split(' ')
            .map(String::from)
            .collect();
        c.setstripe(
            &format!("{top}/dom"),
            client::stripe_args::parse(&opts).unwrap(),
        )
        .await
        .unwrap();
    }
    let mut marks = vec![];
    for (i, top) in ["/secret", "/plain"].iter().enumerate() {
        for sub in ["striped", "dom"] {
            let name = format!("checkpoint-name-{sub}-{}", i * 7 + 1);
            let data = pattern(1000 + i as u64 * 10 + sub.len() as u64, 300 << 10);
            let path = format!("{top}/{sub}/{name}");
            write(&c, &path, &data).await;
            assert_eq!(read(&c, &path).await.unwrap(), data, "{path}");
            let link = format!("symlink-target-{sub}-{i}-points-here");
            c.symlink(&link, &format!("{top}/{sub}/l")).await.unwrap();
            assert_eq!(c.readlink(&format!("{top}/{sub}/l")).await.unwrap(), link);
            marks.push((*top, name, data, link));
        }
    }
    c.sync().await.unwrap();
    drop(c);
    // The MDS stopped cleanly writes its snapshot too: journal and snapshot both searched.
    mds.terminate();
    let mut files = vec![];
    every_file(&root, &mut files);
    assert!(files.iter().map(|(_, b)| b.len()).sum::<usize>() > 1 << 20);
    for (top, name, data, link) in &marks {
        // Pieces from the first unit (on the MDS for a DoM file), a middle one and the end.
        let pieces: Vec<&[u8]> = vec![
            &data[..32],
            &data[150_000..150_032],
            &data[data.len() - 32..],
        ];
        for (what, needle) in [
            ("name", name.as_bytes()),
            ("symlink target", link.as_bytes()),
        ]
        .into_iter()
        .chain(pieces.into_iter().map(|p| ("contents", p)))
        {
            let at = found_in(&files, needle);
            if *top == "/secret" {
                assert!(at.is_empty(), "{what} of {top}/{name} in clear in {at:?}");
            } else {
                assert!(
                    !at.is_empty(),
                    "{what} of {top}/{name} on no disk: the search cannot fail"
                );
            }
        }
    }
}

/// Writes, truncates and reads of every shape against a model of the file, on one handle and
/// across reopens, in a directory of `layout`.
async fn model_run(c: &Client, path: &str, seed: u64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut model: Vec<u8> = vec![];
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(c, path)
        .await
        .unwrap();
    for step in 0..400 {
        let op = rng.gen_range(0..100);
        if op < 55 {
            let at = rng.gen_range(0..200_000u64);
            let n = match rng.gen_range(0..4) {
                0 => rng.gen_range(1..16),
                1 => 4096,
                _ => rng.gen_range(1..40_000),
            };
            let at = if rng.gen_bool(0.2) {
                at / 4096 * 4096
            } else {
                at
            };
            let data = pattern(seed * 1000 + step, n);
            f.write_at(at, &data).await.unwrap();
            let end = at as usize + n;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[at as usize..end].copy_from_slice(&data);
        } else if op < 70 {
            let size = rng.gen_range(0..220_000u64);
            let size = if rng.gen_bool(0.2) {
                size / 4096 * 4096
            } else {
                size
            };
            f.set_len(size).await.unwrap();
            model.resize(size as usize, 0);
            // The whole file, where a unit encrypted at the wrong length would show.
            let mut buf = vec![0u8; model.len() + 10];
            let got = f.read_at(0, &mut buf).await.unwrap();
            assert!(
                got == model.len() && buf[..got] == model[..],
                "{path} step {step}: after a truncate to {size}"
            );
        } else if op < 75 {
            f.close().await.unwrap();
            f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(c, path)
                .await
                .unwrap();
        } else {
            let at = rng.gen_range(0..230_000u64);
            let n = rng.gen_range(1..50_000usize);
            let mut buf = vec![0u8; n];
            let got = f.read_at(at, &mut buf).await.unwrap();
            let want = model
                .get(at as usize..)
                .map_or(&[][..], |m| &m[..n.min(m.len())]);
            assert_eq!(got, want.len(), "{path} step {step}: read of {n} at {at}");
            assert!(
                buf[..got] == *want,
                "{path} step {step}: read of {n} at {at}"
            );
        }
    }
    f.close().await.unwrap();
    assert!(read(c, path).await.unwrap() == model, "{path} at the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_truncates_and_reads_of_every_shape_match_a_model_in_an_encrypted_tree() {
    let (_root, _mds, _oss, c) = cluster("crypt-model").await;
    let k = MasterKey::generate().unwrap();
    c.mkdir("/e", 0o755).await.unwrap();
    c.crypt_set("/e", &k).await.unwrap();
    c.crypt_add_key(k);
    c.mkdir("/e/striped", 0o755).await.unwrap();
    c.setstripe("/e/striped", client::raid0(Some(2), 64 << 10).unwrap())
        .await
        .unwrap();
    c.mkdir("/e/dom", 0o755).await.unwrap();
    let opts: Vec<String> = "-E 64K -L mdt -E -1 -c -1"
        .split(' ')
        .map(String::from)
        .collect();
    c.setstripe("/e/dom", client::stripe_args::parse(&opts).unwrap())
        .await
        .unwrap();
    model_run(&c, "/e/striped/f", 1).await;
    model_run(&c, "/e/dom/f", 2).await;
    // A checkpoint: written under a temporary name, synced, renamed over the last one.
    let ckpt = pattern(9, 3 << 20);
    write(&c, "/e/striped/ckpt.tmp", &ckpt).await;
    c.rename("/e/striped/ckpt.tmp", "/e/striped/ckpt")
        .await
        .unwrap();
    assert!(read(&c, "/e/striped/ckpt").await.unwrap() == ckpt);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_key_names_are_kept_encrypted_and_contents_are_enokey_and_the_mds_keeps_the_edge(
) {
    let (_root, mds, _oss, a) = cluster("crypt-nokey").await;
    let k = MasterKey::generate().unwrap();
    a.mkdir("/e", 0o755).await.unwrap();
    a.mkdir("/clear", 0o755).await.unwrap();
    write(&a, "/clear/f", b"in clear").await;
    a.crypt_set("/e", &k).await.unwrap();
    a.crypt_add_key(MasterKey::new(&[0; 64]).unwrap()); // another key: no use here
    let id = a.crypt_add_key(k);
    write(&a, "/e/weights.bin", &pattern(3, 10_000)).await;
    a.mkdir("/e/dir", 0o755).await.unwrap();
    // A policy only on an empty directory, never changed or removed.
    let other = MasterKey::generate().unwrap();
    let e = a.crypt_set("/e", &other).await.unwrap_err();
    assert_eq!(e.kind(), FsErrorKind::Exists, "{e}");
    let e = a.crypt_set("/clear", &other).await.unwrap_err();
    assert_eq!(e.kind(), FsErrorKind::NotEmpty, "{e}");
    let fid = a.stat("/e").await.unwrap().fid;
    let e = a
        .reint(Mutation::RemoveXattr {
            fid,
            name: proto::crypt::POLICY_XATTR.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FsErrorKind::NotPermitted, "{e}");
    // Nothing moves or is linked across the edge.
    for (from, to) in [("/clear/f", "/e/f"), ("/e/weights.bin", "/clear/w")] {
        let e = a.rename(from, to).await.unwrap_err();
        assert_eq!(e.kind(), FsErrorKind::CrossDevice, "{from} -> {to}: {e}");
        let e = a.link(from, to).await.unwrap_err();
        assert_eq!(e.kind(), FsErrorKind::CrossDevice, "{from} -> {to}: {e}");
    }
    // Without the key (a client of its own, and this one once the key is taken back), and
    // with another key: names as kept, contents ENOKEY, never garbage.
    let b = connect(&mds.nid).await;
    let wrong = connect(&mds.nid).await;
    wrong.crypt_add_key(MasterKey::generate().unwrap());
    for c in [&b, &wrong] {
        let names: Vec<Vec<u8>> = c
            .readdir("/e")
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .filter(|n| n != b"." && n != b"..")
            .collect();
        assert_eq!(names.len(), 2);
        for n in &names {
            assert!(n != b"weights.bin" && n != b"dir", "{n:?}");
            assert!(client::crypt::stored_form(n), "{n:?}");
        }
        let e = c.stat("/e/weights.bin").await.unwrap_err();
        assert_eq!(e.kind(), FsErrorKind::NotFound, "{e}");
        // The kept name finds the file; its contents need the key.
        let mut found = false;
        for n in &names {
            let p = format!("/e/{}", String::from_utf8_lossy(n));
            if c.stat(&p).await.unwrap().kind == proto::md::Kind::File {
                let e = read(c, &p).await.unwrap_err();
                assert_eq!(e.kind(), FsErrorKind::NoKey, "{e}");
                found = true;
            }
        }
        assert!(found);
        // A new name needs the key.
        let e = c.mkdir("/e/new", 0o755).await.unwrap_err();
        assert_eq!(e.kind(), FsErrorKind::NoKey, "{e}");
    }
    assert!(a.crypt_remove_key(&id));
    let e = read(&a, "/e/weights.bin").await.unwrap_err();
    assert_eq!(e.kind(), FsErrorKind::NotFound, "{e}");
    // A kept name can be removed without the key (as fscrypt's no-key names).
    let names = b.readdir("/e").await.unwrap();
    let dir = names
        .iter()
        .find(|d| d.kind == proto::md::Kind::Dir && d.name != b"." && d.name != b"..")
        .unwrap();
    b.rmdir(&format!("/e/{}", String::from_utf8_lossy(&dir.name)))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_met_a_directory_before_its_policy_encrypts_its_names_all_the_same() {
    let (_root, mds, _oss, a) = cluster("crypt-late").await;
    let b = connect(&mds.nid).await;
    a.mkdir("/late", 0o755).await.unwrap();
    // `b` lists it and makes a file beside it while it is clear.
    assert!(b.readdir("/late").await.unwrap().len() <= 2);
    write(&b, "/before", b"clear").await;
    let raw = pattern(5, 64);
    a.crypt_set("/late", &MasterKey::new(&raw).unwrap())
        .await
        .unwrap();
    b.crypt_add_key(MasterKey::new(&raw).unwrap());
    write(&b, "/late/shard-0001.bin", &pattern(6, 5000)).await;
    b.mkdir("/late/sub", 0o755).await.unwrap();
    b.symlink("shard-0001.bin", "/late/link").await.unwrap();
    assert_eq!(
        read(&b, "/late/link").await.unwrap(),
        pattern(6, 5000),
        "through the symlink"
    );
    // No clear name on the MDS: a client without the key sees only encrypted ones.
    let c = connect(&mds.nid).await;
    let kept: Vec<Vec<u8>> = c
        .readdir("/late")
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    assert_eq!(kept.len(), 3);
    for n in &kept {
        assert!(
            client::crypt::stored_form(n),
            "{:?} kept in clear",
            String::from_utf8_lossy(n)
        );
    }
    // Without the key, no new name there (the MDS refuses a clear one too: its own tests).
    let fid = c.stat("/late").await.unwrap().fid;
    let e = c
        .reint(Mutation::Create {
            parent: fid,
            name: b"clear-name".to_vec(),
            kind: proto::md::Kind::File,
            mode: 0o644,
            exclusive: true,
            target: vec![],
            layout: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FsErrorKind::NoKey, "{e}");
}
