//! The `lode` command against a running cluster, as a new user meets it: its output and its
//! errors read as `ls`, `stat`, `rm`, `mkdir` and `cat` print theirs, with their exit status.

use std::process::Command;

use lode_tests::{bin, scratch};

struct Cluster {
    dir: std::path::PathBuf,
    port: String,
}

impl Cluster {
    fn up(name: &str, port: u16) -> Cluster {
        let dir = scratch(name);
        let c = Cluster {
            dir,
            port: port.to_string(),
        };
        let (code, out, err) = c.lode(&[
            "cluster",
            "up",
            "--dir",
            c.dir.to_str().unwrap(),
            "--port",
            &c.port,
        ]);
        assert_eq!(code, 0, "cluster up: {out}{err}");
        c
    }

    /// Status, stdout, stderr.
    fn lode(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(bin("lode"))
            .args(args)
            .env("LODE_MDS", format!("127.0.0.1:{}", self.port))
            .env("LODE_KEY", self.dir.join("client.key"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.lode(&["cluster", "down", "--dir", self.dir.to_str().unwrap()]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_command_prints_and_fails_as_coreutils_do() {
    let c = Cluster::up("cli", 9731);
    assert_eq!(c.lode(&["mkdir", "/d"]).0, 0);
    let local = c.dir.join("hello.txt");
    std::fs::write(&local, b"hello\n").unwrap();
    let (code, _, err) = c.lode(&["cp", &format!("local:{}", local.display()), "/d/f"]);
    assert_eq!(code, 0, "{err}");

    // ls -l: mode letters, owner names, a date, sorted names.
    assert_eq!(c.lode(&["mkdir", "/d/a"]).0, 0);
    let (code, out, err) = c.lode(&["ls", "-l", "/d"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("drwxr-xr-x "), "{out}");
    assert!(lines[0].ends_with(" a"), "{out}");
    assert!(lines[1].starts_with("-rw-r--r-- 1 root root 6 "), "{out}");
    assert!(lines[1].ends_with(" f"), "{out}");
    let month = lines[1].split_whitespace().nth(5).unwrap();
    assert!(
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
            .contains(&month),
        "no month in {out}"
    );

    // stat: octal and letters, named owner, dated times.
    let (code, out, _) = c.lode(&["stat", "/d/f"]);
    assert_eq!(code, 0);
    assert!(out.contains("Access: (0644/-rw-r--r--)"), "{out}");
    assert!(out.contains("Uid: (    0/    root)"), "{out}");
    assert!(out.contains("regular file"), "{out}");
    let modify = out.lines().find(|l| l.starts_with("Modify: ")).unwrap();
    assert_eq!(modify.matches('-').count(), 2, "a date: {modify}");
    assert_eq!(modify.matches(':').count(), 3, "a time: {modify}");

    // Errors: one line, as coreutils word them, and their status.
    let (code, out, err) = c.lode(&["ls", "/nonexistent"]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(
        err,
        "lode: cannot access '/nonexistent': No such file or directory\n"
    );
    let (code, _, err) = c.lode(&["stat", "/nope"]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "lode: cannot stat '/nope': No such file or directory\n"
    );
    let (code, _, err) = c.lode(&["mkdir", "/d"]);
    assert_eq!(code, 1);
    assert_eq!(err, "lode: cannot create directory '/d': File exists\n");
    let (code, _, err) = c.lode(&["rm", "/d"]);
    assert_eq!(code, 1);
    assert_eq!(err, "lode: cannot remove '/d': Is a directory\n");
    let (code, _, err) = c.lode(&["cat", "/nope"]);
    assert_eq!(code, 1);
    assert_eq!(err, "lode: cat: /nope: No such file or directory\n");
    // rm goes on past an operand it cannot remove, and fails at the end.
    let (code, _, err) = c.lode(&["rm", "/missing", "/d/f"]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "lode: cannot remove '/missing': No such file or directory\n"
    );
    assert_eq!(c.lode(&["ls", "/d"]).1, "a\n");

    // df ends its last line, so the prompt starts on its own.
    let (code, out, _) = c.lode(&["df"]);
    assert_eq!(code, 0);
    assert!(out.ends_with("lode\n"), "{out:?}");

    // cp's help says how to name a local file.
    let (_, out, _) = c.lode(&["cp", "--help"]);
    assert!(out.contains("local:"), "{out}");
}

/// `cluster up` checks the new cluster with a client of its own, which leaves no lease behind:
/// one it had not given back would hold up the first change to what it cached (the root, where
/// its test file went) until the lease's term ran out.
#[test]
fn cluster_up_leaves_no_lease_to_hold_up_the_first_change() {
    let c = Cluster::up("cli-leases", 9741);
    assert_eq!(c.lode(&["mkdir", "/first"]).0, 0);
    let log = std::fs::read_to_string(c.dir.join("logs").join("mds.log")).unwrap();
    assert!(
        !log.contains("did not acknowledge a lease recall"),
        "a client of cluster up held a lease: {log}"
    );
}

/// A server of a cluster killed with SIGKILL is started again by `cluster up`, which leaves the
/// servers still running alone; the files made before are all there, and new ones can be made.
#[test]
fn cluster_up_starts_again_only_the_servers_that_stopped() {
    let c = Cluster::up("cli-restart", 9751);
    let local = c.dir.join("hello.txt");
    std::fs::write(&local, b"hello\n").unwrap();
    let (code, _, err) = c.lode(&["cp", &format!("local:{}", local.display()), "/before"]);
    assert_eq!(code, 0, "{err}");
    let pids = || -> Vec<(String, i32)> {
        std::fs::read_to_string(c.dir.join("cluster.pids"))
            .unwrap()
            .lines()
            .map(|l| {
                let (r, p) = l.split_once(' ').unwrap();
                (r.to_owned(), p.parse().unwrap())
            })
            .collect()
    };
    let before = pids();
    let victims: Vec<i32> = before
        .iter()
        .filter(|(r, _)| r == "mds" || r == "oss1")
        .map(|(_, p)| *p)
        .collect();
    assert_eq!(victims.len(), 2, "{before:?}");
    for p in &victims {
        // SAFETY: kill with a pid the cluster recorded, and a plain signal.
        assert_eq!(unsafe { libc::kill(*p, libc::SIGKILL) }, 0);
    }
    let dir = c.dir.to_str().unwrap();
    let (code, out, err) = c.lode(&["cluster", "up", "--dir", dir]);
    assert_eq!(code, 0, "cluster up again: {out}{err}");
    assert!(out.contains("starting mds again"), "{out}");
    assert!(out.contains("starting oss1 again"), "{out}");
    let after = pids();
    assert_eq!(after.len(), before.len(), "{after:?}");
    for ((role, old), (role2, new)) in before.iter().zip(&after) {
        assert_eq!(role, role2);
        assert_eq!(
            old == new,
            !victims.contains(old),
            "{role}: pid {old} then {new}"
        );
    }
    let (code, out, err) = c.lode(&["cat", "/before"]);
    assert_eq!((code, out.as_str()), (0, "hello\n"), "{err}");
    let (code, _, err) = c.lode(&["cp", &format!("local:{}", local.display()), "/after"]);
    assert_eq!(code, 0, "{err}");
    // With every server running, `up` refuses, and says how to stop the cluster.
    let (code, _, err) = c.lode(&["cluster", "up", "--dir", dir]);
    assert_eq!(code, 1);
    assert!(err.contains("already runs"), "{err}");
}

/// `cluster up --mdts 3`: three MDSs as processes, every one listed by `df` (bytes and inodes)
/// and `status`; one killed shows as down, and `up` again starts only it, which registers
/// with MDT0 again.
#[test]
fn cluster_up_with_three_mdts_lists_them_and_starts_again_a_lost_one() {
    let dir = scratch("cli-mdts");
    let c = Cluster {
        dir,
        port: "9761".into(),
    };
    let d = c.dir.to_str().unwrap().to_owned();
    let (code, out, err) = c.lode(&[
        "cluster", "up", "--dir", &d, "--port", &c.port, "--mdts", "3", "--oss", "2",
    ]);
    assert_eq!(code, 0, "cluster up: {out}{err}");
    assert!(out.contains("3 MDTs"), "{out}");
    let (code, out, err) = c.lode(&["df"]);
    assert_eq!(code, 0, "{err}");
    for k in 0..3 {
        assert!(out.contains(&format!("lode-MDT{k:04x}_UUID")), "{out}");
        assert!(out.contains(&format!("lode[MDT:{k}]")), "{out}");
    }
    assert!(!out.contains("(down)"), "{out}");
    let (code, out, _) = c.lode(&["df", "-i"]);
    assert_eq!(code, 0);
    // Each MDT holds its root, and nothing else yet.
    assert_eq!(out.matches(" 1 ").count(), 3, "{out}");
    let (_, out, _) = c.lode(&["cluster", "status", "--dir", &d]);
    assert!(out.contains("mdt2") && out.contains("MDT2"), "{out}");
    // A directory on MDT2, used as any other; not removed while it holds a file.
    assert_eq!(c.lode(&["mkdir", "-i", "2", "/two"]).0, 0);
    assert_eq!(c.lode(&["getdirstripe", "-m", "/two"]).1, "2\n");
    assert_eq!(
        c.lode(&["getdirstripe", "/"]).1,
        "lmv_stripe_count: 0 lmv_stripe_offset: 0 lmv_hash_type: none\n"
    );
    let local = c.dir.join("hello.txt");
    std::fs::write(&local, b"on MDT2\n").unwrap();
    let (code, _, err) = c.lode(&["cp", &format!("local:{}", local.display()), "/two/f"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(c.lode(&["cat", "/two/f"]).1, "on MDT2\n");
    assert_eq!(c.lode(&["ls", "/two"]).1, "f\n");
    let (_, out, _) = c.lode(&["df", "-i"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("lode-MDT0002_UUID") && l.split_whitespace().nth(2) == Some("3")),
        "MDT2 holds its root, /two and /two/f: {out}"
    );
    let (code, _, err) = c.lode(&["rm", "-r", "/two"]);
    assert_eq!(code, 0, "{err}");
    assert!(c.lode(&["ls", "/two"]).0 != 0);

    // A directory striped over the three MDTs: its names spread, listed whole, renamed
    // between shards, removed with what it holds.
    let (code, _, err) = c.lode(&["setdirstripe", "-c", "3", "/wide"]);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = c.lode(&["getdirstripe", "/wide"]);
    assert!(
        out.starts_with("lmv_stripe_count: 3 lmv_stripe_offset: 0 lmv_hash_type: fnv_1a_64\n"),
        "{out}"
    );
    let shard_mdts: Vec<&str> = out
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(shard_mdts, ["0", "1", "2"], "{out}");
    let mut want = vec![];
    for i in 0..9 {
        let (code, _, err) = c.lode(&[
            "cp",
            &format!("local:{}", local.display()),
            &format!("/wide/f{i}"),
        ]);
        assert_eq!(code, 0, "{err}");
        want.push(format!("f{i}"));
    }
    for (i, w) in want.iter_mut().enumerate().take(3) {
        assert_eq!(
            c.lode(&["mv", &format!("/wide/f{i}"), &format!("/wide/g{i}")])
                .0,
            0
        );
        *w = format!("g{i}");
        assert_eq!(c.lode(&["cat", &format!("/wide/g{i}")]).1, "on MDT2\n");
    }
    let (_, out, _) = c.lode(&["ls", "/wide"]);
    let mut listed: Vec<&str> = out.lines().collect();
    listed.sort_unstable();
    want.sort();
    assert_eq!(listed, want);
    let (code, _, err) = c.lode(&["setdirstripe", "-c", "4", "/toowide"]);
    assert_ne!(code, 0);
    assert!(err.contains("has 3"), "{err}");
    let (code, _, err) = c.lode(&["mkdir", "-c", "2", "-H", "crc", "/badhash"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown hash type"), "{err}");
    let (code, _, err) = c.lode(&["rm", "-r", "/wide"]);
    assert_eq!(code, 0, "{err}");
    assert!(c.lode(&["ls", "/wide"]).0 != 0);

    // A default for new subdirectories: set, shown, used one level down, removed.
    assert_eq!(c.lode(&["mkdir", "-i", "0", "/jobs"]).0, 0);
    let set = [
        "setdirstripe",
        "-D",
        "-c",
        "2",
        "--max-inherit",
        "1",
        "/jobs",
    ];
    let (code, _, err) = c.lode(&set);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = c.lode(&["getdirstripe", "-D", "/jobs"]);
    assert_eq!(
        out,
        "lmv_stripe_count: 2 lmv_stripe_offset: -1 lmv_hash_type: fnv_1a_64 lmv_max_inherit: 1\n"
    );
    assert_eq!(c.lode(&["mkdir", "/jobs/a"]).0, 0);
    let (_, out, _) = c.lode(&["getdirstripe", "/jobs/a"]);
    assert!(out.starts_with("lmv_stripe_count: 2 "), "{out}");
    let (_, out, _) = c.lode(&["getdirstripe", "-D", "/jobs/a"]);
    assert!(out.ends_with("lmv_max_inherit: 0\n"), "{out}");
    let (code, _, err) = c.lode(&["setdirstripe", "-d", "/jobs"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(c.lode(&["getdirstripe", "-D", "/jobs"]).1, "");
    let (code, _, err) = c.lode(&["setdirstripe", "-D", "-H", "crc", "/jobs"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown hash"), "{err}");
    assert_eq!(c.lode(&["rm", "-r", "/jobs"]).0, 0);

    let pid: i32 = std::fs::read_to_string(c.dir.join("cluster.pids"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("mdt1 "))
        .expect("mdt1 recorded")
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill with a pid the cluster recorded, and a plain signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // A down MDT is a line of its own, not an error of the whole command.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (code, out, _) = c.lode(&["df"]);
        assert_eq!(code, 0);
        if out.contains("lode[MDT:1] (down)") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{out}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (code, out, err) = c.lode(&["cluster", "up", "--dir", &d]);
    assert_eq!(code, 0, "cluster up again: {out}{err}");
    assert!(out.contains("starting mdt1 again"), "{out}");
    let (_, out, _) = c.lode(&["df"]);
    assert!(!out.contains("(down)"), "{out}");
}

/// Two `lode mv` loops moving files between a directory of MDT0 and one of MDT1, and a third
/// moving directories, while each `lode-mds` process is killed -9 and started again: every
/// file and directory ends with exactly one name and its bytes, and the offline check of both
/// MDTs finds nothing.
#[test]
fn renames_across_mdts_survive_kill_9_of_either_mds_process() {
    let dir = scratch("cli-moves");
    let c = Cluster {
        dir,
        port: "9781".into(),
    };
    let d = c.dir.to_str().unwrap().to_owned();
    let (code, out, err) = c.lode(&[
        "cluster", "up", "--dir", &d, "--port", &c.port, "--mdts", "2", "--oss", "2",
    ]);
    assert_eq!(code, 0, "cluster up: {out}{err}");
    assert_eq!(c.lode(&["mkdir", "/x"]).0, 0);
    assert_eq!(c.lode(&["mkdir", "-i", "1", "/y"]).0, 0);
    const FILES: usize = 6;
    for i in 0..FILES {
        let local = c.dir.join(format!("f{i}"));
        std::fs::write(&local, format!("file {i}\n")).unwrap();
        let (code, _, err) = c.lode(&[
            "cp",
            &format!("local:{}", local.display()),
            &format!("/x/f{i}"),
        ]);
        assert_eq!(code, 0, "{err}");
    }
    // Two directories a third loop moves: one of /x's MDT, one of MDT1.
    assert_eq!(c.lode(&["mkdir", "/x/d0"]).0, 0);
    assert_eq!(c.lode(&["mkdir", "-i", "1", "/x/d1"]).0, 0);
    for k in 0..2 {
        let local = c.dir.join(format!("in{k}"));
        std::fs::write(&local, format!("dir {k}\n")).unwrap();
        let to = format!("/x/d{k}/in");
        let (code, _, err) = c.lode(&["cp", &format!("local:{}", local.display()), &to]);
        assert_eq!(code, 0, "{err}");
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let moved = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = std::sync::Arc::new(c);
    let movers: Vec<_> = (0..3)
        .map(|k| {
            let (c, stop, moved) = (c.clone(), stop.clone(), moved.clone());
            std::thread::spawn(move || {
                let mut round = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let names: Vec<String> = if k < 2 {
                        (k..FILES).step_by(2).map(|i| format!("f{i}")).collect()
                    } else {
                        vec!["d0".into(), "d1".into()]
                    };
                    for n in names {
                        let (a, b) = if round % 2 == 0 {
                            ("x", "y")
                        } else {
                            ("y", "x")
                        };
                        if c.lode(&["mv", &format!("/{a}/{n}"), &format!("/{b}/{n}")])
                            .0
                            == 0
                        {
                            moved.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    round += 1;
                }
            })
        })
        .collect();
    let pid_of = |role: &str| -> i32 {
        std::fs::read_to_string(c.dir.join("cluster.pids"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{role} ")))
            .unwrap_or_else(|| panic!("{role} recorded"))
            .trim()
            .parse()
            .unwrap()
    };
    for role in ["mdt1", "mds", "mdt1", "mds"] {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // SAFETY: kill with a pid the cluster recorded, and a plain signal.
        assert_eq!(unsafe { libc::kill(pid_of(role), libc::SIGKILL) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (code, out, err) = c.lode(&["cluster", "up", "--dir", &d]);
        assert_eq!(code, 0, "cluster up again after {role}: {out}{err}");
    }
    std::thread::sleep(std::time::Duration::from_millis(1000));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for m in movers {
        m.join().unwrap();
    }
    let moved = moved.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{moved} renames across MDTs answered during the kills");
    assert!(moved > 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut seen: Vec<String> = vec![];
        for dd in ["/x", "/y"] {
            let (code, out, _) = c.lode(&["ls", dd]);
            assert_eq!(code, 0);
            seen.extend(out.lines().map(str::to_owned));
        }
        seen.sort();
        let mut want: Vec<String> = (0..FILES).map(|i| format!("f{i}")).collect();
        want.extend(["d0".to_string(), "d1".to_string()]);
        want.sort();
        if seen == want {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after the kills: {seen:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    for i in 0..FILES {
        let at = if c.lode(&["stat", &format!("/x/f{i}")]).0 == 0 {
            "x"
        } else {
            "y"
        };
        assert_eq!(
            c.lode(&["cat", &format!("/{at}/f{i}")]).1,
            format!("file {i}\n")
        );
    }
    for k in 0..2 {
        let at = if c.lode(&["stat", &format!("/x/d{k}")]).0 == 0 {
            "x"
        } else {
            "y"
        };
        assert_eq!(
            c.lode(&["cat", &format!("/{at}/d{k}/in")]).1,
            format!("dir {k}\n")
        );
    }
    let (code, _, err) = c.lode(&["cluster", "down", "--dir", &d]);
    assert_eq!(code, 0, "{err}");
    let out = Command::new(bin("lode-mds"))
        .args(["fsck", "--data-dir"])
        .arg(c.dir.join("mds"))
        .arg("--data-dir")
        .arg(c.dir.join("mdt1"))
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("across the 2 MDTs: 0 problems"),
        "{printed}"
    );
}
