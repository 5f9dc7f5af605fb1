//! The servers' metrics endpoints: what they serve parses as Prometheus text, and their
//! counters move exactly with the work done (a known number of creates and bytes).

use std::collections::HashMap;
use std::io::{Read, Write};

use client::{Client, ClientConfig, OpenOptions};
use lode_tests::{client_security, scratch, Server};

/// A port free now on loopback.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// One scrape, checked line by line against the text format: `# HELP`, `# TYPE`, `# UNIT`
/// and `# EOF` comments, and samples `name{labels} value`. Returns the samples by their
/// name and labels as written.
fn scrape(addr: &str) -> HashMap<String, f64> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: lode\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a header and a body");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "the body ends the exposition");
    let mut samples = HashMap::new();
    for line in body.lines() {
        if let Some(c) = line.strip_prefix("# ") {
            let word = c.split(' ').next().unwrap();
            assert!(
                ["HELP", "TYPE", "UNIT", "EOF"].contains(&word),
                "comment {line:?}"
            );
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("a sample has a value");
        let name_end = key.find('{').unwrap_or(key.len());
        let name = &key[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "metric name in {line:?}"
        );
        if name_end < key.len() {
            assert!(key.ends_with('}'), "labels in {line:?}");
        }
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value in {line:?}")),
        };
        samples.insert(key.to_owned(), v);
    }
    samples
}

/// A mount of `mds` at `root/mnt` serving its metrics: the mount point, the metrics address
/// and the mount's process.
fn mount_with_metrics(
    root: &std::path::Path,
    mds: &Server,
) -> (std::path::PathBuf, String, Server) {
    let mnt = root.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let addr = free_addr();
    let mount = Server::start(
        "lode",
        &[
            "--mds",
            &mds.nid.to_string(),
            "mount",
            mnt.to_str().unwrap(),
            "--metrics",
            &addr,
        ],
    )
    .unwrap();
    (mnt, addr, mount)
}

fn get(samples: &HashMap<String, f64>, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_exactly_with_the_creates_and_bytes_done() {
    let root = scratch("metrics");
    let (mds_metrics, oss_metrics) = (free_addr(), free_addr());
    let mds = Server::start(
        "lode-mds",
        &[
            "--data-dir",
            root.join("mds").to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            &mds_metrics,
        ],
    )
    .unwrap();
    // The storage server reads its settings from a config file, as a deployed one does.
    let config = root.join("oss.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nmds = \"{}\"\nlisten = \"127.0.0.1:0\"\nmetrics = \"{oss_metrics}\"\nheartbeat_s = 1\n",
            root.join("oss").to_str().unwrap(),
            mds.nid
        ),
    )
    .unwrap();
    let _oss = Server::start("lode-oss", &["--config", config.to_str().unwrap()]).unwrap();

    let before_mds = scrape(&mds_metrics);
    let before_oss = scrape(&oss_metrics);
    let c = Client::connect_with(
        &mds.nid.to_string(),
        ClientConfig {
            security: Some(client_security()),
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap();
    let files = 25u64;
    let mut written = 0u64;
    for i in 0..files {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .stripe_count(1)
            .open(&c, &format!("/m{i}"))
            .await
            .unwrap();
        let data = vec![i as u8; 100_000 + i as usize];
        f.write_at(0, &data).await.unwrap();
        written += data.len() as u64;
        f.fsync().await.unwrap();
        f.close().await.unwrap();
    }
    let after_mds = scrape(&mds_metrics);
    let after_oss = scrape(&oss_metrics);

    let creates = r#"lode_mds_changes_total{op="create"}"#;
    assert_eq!(
        get(&after_mds, creates) - get(&before_mds, creates),
        files as f64,
        "creates counted"
    );
    let bytes = r#"lode_oss_write_bytes_total{target="0"}"#;
    assert_eq!(
        get(&after_oss, bytes) - get(&before_oss, bytes),
        written as f64,
        "bytes written counted"
    );
    let writes = r#"lode_oss_writes_total{target="0"}"#;
    assert!(get(&after_oss, writes) - get(&before_oss, writes) >= files as f64);
    let ost_write = r#"lode_rpc_requests_total{op="ost_write"}"#;
    assert_eq!(
        get(&after_oss, ost_write) - get(&before_oss, ost_write),
        get(&after_oss, writes) - get(&before_oss, writes),
        "each write request applied once"
    );
    assert!(get(&after_mds, "lode_mds_journal_commit_seconds_count") > 0.0);
    // The status answer (what `lode top` reads) counts each operation as the metrics do.
    let status = c
        .server_status(None, false, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    let reints = status
        .ops
        .iter()
        .find(|o| o.op == "mds_reint")
        .map_or(0, |o| o.count);
    assert_eq!(
        reints as f64,
        get(
            &scrape(&mds_metrics),
            r#"lode_rpc_requests_total{op="mds_reint"}"#
        )
    );
    assert!(reints >= files, "{reints}");
    assert!(get(&after_mds, "lode_mds_clients") >= 1.0);
    assert_eq!(get(&after_mds, "lode_mds_targets_in_service"), 1.0);
    assert!(get(&after_mds, "lode_mds_inodes") >= (files + 1) as f64);
    // Open connections are counted every second: this client's, and the storage server's
    // own to the MDS.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let conns = get(&scrape(&mds_metrics), "lode_rpc_connections");
    assert!(conns >= 2.0, "{conns}");
    assert!(get(&scrape(&oss_metrics), "lode_rpc_connections") >= 1.0);
    assert!(get(&after_oss, r#"lode_oss_space_total_bytes{target="0"}"#) > 0.0);
    // Objects are counted by a walk at most every 30 s: the first scrape's count stands.
    assert!(after_oss.contains_key(r#"lode_oss_objects{target="0"}"#));
}

/// The mount's endpoint: the kernel's creates and the bytes written through it counted
/// exactly, open files as they are, and the client's calls to the servers by operation.
#[test]
fn the_mount_counts_its_requests_bytes_and_calls() {
    // SAFETY: geteuid has no preconditions.
    if !std::path::Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let root = scratch("mount-metrics");
    let mds = lode_tests::mds_of(&root);
    let _oss = lode_tests::oss_of(&root.join("oss"), &mds.nid);
    let (mnt, addr, mount) = mount_with_metrics(&root, &mds);
    let before = scrape(&addr);
    let (files, size) = (25, 3000);
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..files {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(mnt.join(format!("d/f{i}")))
            .unwrap();
        f.write_all(&vec![i as u8; size]).unwrap();
        f.sync_all().unwrap();
    }
    let held: Vec<std::fs::File> = (0..3)
        .map(|i| std::fs::File::open(mnt.join(format!("d/f{i}"))).unwrap())
        .collect();
    let after = scrape(&addr);
    let moved = |key: &str| get(&after, key) - get(&before, key);
    assert_eq!(
        moved(r#"lode_mount_requests_total{op="create"}"#),
        files as f64
    );
    assert_eq!(moved(r#"lode_mount_requests_total{op="mkdir"}"#), 1.0);
    assert_eq!(
        moved("lode_mount_written_bytes_total"),
        (files * size) as f64
    );
    assert_eq!(get(&after, "lode_mount_open_files"), 3.0);
    assert!(after.contains_key("lode_mount_leases"));
    assert!(after.contains_key("lode_mount_uncommitted_changes"));
    // The client's calls: writes went to the storage server, the namespace to the MDS.
    assert!(moved(r#"lode_client_calls_total{op="ost_write"}"#) >= files as f64);
    let mds_calls: f64 = after
        .iter()
        .filter(|(k, _)| k.starts_with(r#"lode_client_calls_total{op="mds_"#))
        .map(|(_, v)| v)
        .sum();
    assert!(mds_calls > 0.0, "no MDS calls counted");
    assert!(after
        .keys()
        .any(|k| k.starts_with("lode_client_call_latency_seconds_bucket")));
    drop(held);
    // Each close of a written file flushed; the closes of those opened only to be read sent
    // nothing the caller waited for.
    let closed = scrape(&addr);
    assert_eq!(
        get(&closed, r#"lode_mount_requests_total{op="flush"}"#)
            - get(&before, r#"lode_mount_requests_total{op="flush"}"#),
        files as f64
    );

    // Requests through the mount carry the job of the process that made them.
    // The shell opens the file (its job is read meanwhile), then becomes dd, same process.
    // It opens it for writing too: a small file opened only to be read is read at its open,
    // which would count those bytes as well.
    let dd = std::process::Command::new("sh")
        .args([
            "-c",
            r#"exec 3<>"$1"; sleep 0.5; exec dd if="$1" of=/dev/null bs=4096 iflag=direct"#,
            "sh",
        ])
        .arg(mnt.join("d/f5"))
        .env("LODE_JOBID", "reader.mnt")
        .output()
        .unwrap();
    assert!(
        dd.status.success(),
        "{}",
        String::from_utf8_lossy(&dd.stderr)
    );
    let out = std::process::Command::new(lode_tests::bin("lode"))
        .args(["jobstats", "--job", "reader.mnt"])
        .env("LODE_MDS", mds.nid.to_string())
        .env("LODE_KEY", lode_tests::cluster_key_file())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let read: u64 = text
        .lines()
        .filter(|l| l.trim_start().starts_with("read_bytes:"))
        .map(|l| {
            let n = l.rsplit_once("sum:").unwrap().1;
            n.trim()
                .trim_end_matches('}')
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(
        read, size as u64,
        "the reader's bytes, under its job:\n{text}"
    );

    // A small file made through the mount is read back from the mount's copy of its bytes
    // (the O_DIRECT read above went to the storage server).
    let before = scrape(&addr);
    assert!(std::fs::read(mnt.join("d/f7")).unwrap() == vec![7u8; size]);
    let after = scrape(&addr);
    let moved = |key: &str| get(&after, key) - get(&before, key);
    assert_eq!(moved("lode_mount_copy_read_bytes_total"), size as f64);
    assert_eq!(moved(r#"lode_client_calls_total{op="ost_read"}"#), 0.0);
    assert!(mount.terminate().success(), "the mount unmounts on SIGTERM");
}

/// A mount looking up, one after another, names of a directory another client filled reads
/// the directory with its entries' attributes once (statahead) instead of asking the MDS for
/// each name; what such a listing leaves out (a symlink's target, xattrs, the layout) is still
/// read whole where asked for, and another client's later change still shows.
#[test]
fn lookups_of_many_names_in_one_directory_read_it_whole_once() {
    // SAFETY: geteuid has no preconditions.
    if !std::path::Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let root = scratch("statahead");
    let mds = lode_tests::mds_of(&root);
    let _oss = lode_tests::oss_of(&root.join("oss"), &mds.nid);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let writer = rt.block_on(async {
        Client::connect_with(
            &mds.nid.to_string(),
            ClientConfig {
                security: Some(client_security()),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap()
    });
    let files = 300usize;
    rt.block_on(async {
        writer.mkdir_all("/sa", 0o755).await.unwrap();
        for i in 0..files {
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&writer, &format!("/sa/f{i}"))
                .await
                .unwrap();
            f.write_at(0, &vec![7u8; i + 1]).await.unwrap();
            f.close().await.unwrap();
        }
        writer.symlink("f3", "/sa/ln").await.unwrap();
        writer.sync().await.unwrap();
    });
    let (mnt, addr, mount) = mount_with_metrics(&root, &mds);
    let dir = mnt.join("sa");
    let before = scrape(&addr);
    for i in 0..files {
        let m = std::fs::metadata(dir.join(format!("f{i}"))).unwrap();
        assert_eq!(m.len(), i as u64 + 1, "f{i}");
    }
    // Absent names are answered from the listing too.
    assert_eq!(
        std::fs::metadata(dir.join("nothing")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    let after = scrape(&addr);
    let asked = |key: &str| get(&after, key) - get(&before, key);
    let asked = asked(r#"lode_client_calls_total{op="mds_lookup"}"#)
        + asked(r#"lode_client_calls_total{op="mds_getattr"}"#);
    assert!(
        asked < 40.0,
        "{asked} lookups and getattrs for {files} names"
    );
    // The listing left out the symlink's target: it is read whole.
    assert_eq!(
        std::fs::read_link(dir.join("ln")).unwrap(),
        std::path::Path::new("f3")
    );
    assert_eq!(std::fs::metadata(dir.join("ln")).unwrap().len(), 4);
    // So after a listing through the kernel (readdirplus).
    for e in std::fs::read_dir(&dir).unwrap() {
        e.unwrap().metadata().unwrap();
    }
    assert_eq!(
        std::fs::read_link(dir.join("ln")).unwrap(),
        std::path::Path::new("f3")
    );
    assert_eq!(std::fs::read(dir.join("ln")).unwrap(), vec![7u8; 4]);

    // The writer's later change recalls what the mount read ahead.
    rt.block_on(async {
        let f = OpenOptions::new()
            .write(true)
            .open(&writer, "/sa/f7")
            .await
            .unwrap();
        f.write_at(8, &[1u8; 992]).await.unwrap();
        f.close().await.unwrap();
        writer.sync().await.unwrap();
    });
    let start = std::time::Instant::now();
    while std::fs::metadata(dir.join("f7")).unwrap().len() != 1000 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "the mount still shows the size before another client's write"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(mount.terminate().success(), "the mount unmounts on SIGTERM");
}
