//! The FUSE mount with real tools: a cluster on loopback, `lode mount`, and the POSIX calls and
//! programs training code uses, checked through the kernel.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lode_tests::{bin, client_key_file, mds_of, scratch, Server};

fn mounted(p: &Path) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
}

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

fn sh(dir: &Path, script: &str) -> (bool, String) {
    said(
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .output()
            .unwrap(),
    )
}

/// Whether a command succeeded, and what it printed (stdout, then stderr).
fn said(out: std::process::Output) -> (bool, String) {
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

// Long by design: one mount, one scenario: starting servers and mounting costs seconds, so every
// call and tool runs against the same mount, in order.
#[test]
fn posix_calls_and_real_tools_work_on_a_mount() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let root = scratch("mount");
    let mds = mds_of(&root);
    let _oss = Server::start(
        "lode-oss",
        &[
            "--data-dir",
            root.join("oss").to_str().unwrap(),
            "--mds",
            &mds.nid.to_string(),
            "--listen",
            "127.0.0.1:0",
            "--targets",
            "2",
        ],
    )
    .unwrap();
    let mnt: PathBuf = root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mount = Server::start(
        "lode",
        &[
            "--mds",
            &mds.nid.to_string(),
            "mount",
            mnt.to_str().unwrap(),
            "-o",
            "allow_other,default_permissions",
        ],
    )
    .unwrap();
    assert!(mounted(&mnt));
    let m = |p: &str| mnt.join(p);

    // Files: write, close, stat, read back.
    fs::write(m("a.txt"), b"hello lode\n").unwrap();
    assert_eq!(fs::metadata(m("a.txt")).unwrap().len(), 11);
    assert_eq!(fs::read(m("a.txt")).unwrap(), b"hello lode\n");
    let big: Vec<u8> = (0..5_000_000u32).map(|i| (i * 13 % 256) as u8).collect();
    fs::write(m("big"), &big).unwrap();
    assert!(fs::read(m("big")).unwrap() == big);
    // A file polls ready both ways, as on a local disk.
    {
        use std::os::fd::AsRawFd;
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m("a.txt"))
            .unwrap();
        for _ in 0..2 {
            let mut p = libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN | libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the length given.
            assert_eq!(unsafe { libc::poll(&mut p, 1, 1000) }, 1);
            assert_eq!(p.revents, libc::POLLIN | libc::POLLOUT);
        }
    }

    // The errors POSIX names.
    fs::create_dir(m("d")).unwrap();
    fs::write(m("d/x"), b"x").unwrap();
    assert_eq!(errno_of(fs::create_dir(m("d"))), libc::EEXIST);
    assert_eq!(errno_of(fs::remove_dir(m("d"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(fs::remove_file(m("nope"))), libc::ENOENT);
    assert_eq!(errno_of(fs::read(m("a.txt/inside"))), libc::ENOTDIR);
    assert_eq!(
        errno_of(fs::OpenOptions::new().write(true).open(m("d"))),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(fs::write(m(&"n".repeat(256)), b"")),
        libc::ENAMETOOLONG
    );
    std::os::unix::fs::symlink(m("loop2"), m("loop1")).unwrap();
    std::os::unix::fs::symlink(m("loop1"), m("loop2")).unwrap();
    assert_eq!(errno_of(fs::read(m("loop1"))), libc::ELOOP);
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m("a.txt"))
        ),
        libc::EEXIST
    );

    // Links, symlinks, modes, times, sizes: stat shows them at once.
    fs::hard_link(m("a.txt"), m("a2.txt")).unwrap();
    assert_eq!(fs::metadata(m("a.txt")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("a.txt", m("s")).unwrap();
    assert_eq!(fs::read_link(m("s")).unwrap(), Path::new("a.txt"));
    assert_eq!(fs::read(m("s")).unwrap(), b"hello lode\n");
    fs::set_permissions(m("a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m("a2.txt")).unwrap().mode() & 0o7777, 0o600);
    let times = [
        libc::timespec {
            tv_sec: 1 << 33,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 987_654_321,
        },
    ];
    let c = CString::new(m("a.txt").to_str().unwrap()).unwrap();
    // SAFETY: a valid path and two timespecs.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(m("a.txt")).unwrap();
    assert_eq!(
        (md.atime(), md.atime_nsec(), md.mtime(), md.mtime_nsec()),
        (1 << 33, 123_456_789, 1_000_000_000, 987_654_321)
    );
    fs::OpenOptions::new()
        .write(true)
        .open(m("big"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    assert_eq!(fs::metadata(m("big")).unwrap().len(), 1000);
    assert!(fs::read(m("big")).unwrap() == big[..1000]);
    let v = CString::new("user.tag").unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    unsafe {
        assert_eq!(
            libc::setxattr(c.as_ptr(), v.as_ptr(), b"val".as_ptr().cast(), 3, 0),
            0
        );
        let mut buf = [0u8; 16];
        assert_eq!(
            libc::getxattr(c.as_ptr(), v.as_ptr(), buf.as_mut_ptr().cast(), 16),
            3
        );
        assert_eq!(&buf[..3], b"val");
        // XATTR_CREATE on a name there, XATTR_REPLACE on one that is not: refused, unchanged.
        let set = |name: &CString, flags| {
            if libc::setxattr(c.as_ptr(), name.as_ptr(), b"new".as_ptr().cast(), 3, flags) == 0 {
                0
            } else {
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
            }
        };
        let absent = CString::new("user.absent").unwrap();
        assert_eq!(set(&v, libc::XATTR_CREATE), libc::EEXIST);
        assert_eq!(set(&absent, libc::XATTR_REPLACE), libc::ENODATA);
        assert_eq!(
            libc::getxattr(c.as_ptr(), absent.as_ptr(), buf.as_mut_ptr().cast(), 16),
            -1
        );
        assert_eq!(set(&v, libc::XATTR_REPLACE), 0);
        assert_eq!(set(&absent, libc::XATTR_CREATE), 0);
        assert_eq!(
            libc::getxattr(c.as_ptr(), v.as_ptr(), buf.as_mut_ptr().cast(), 16),
            3
        );
        assert_eq!(&buf[..3], b"new");
        // Names outside user.* are never kept: asked for, they are not supported (so `ls -l`
        // stops asking for ACLs and security labels after the first file), and not set.
        for name in ["security.selinux", "system.posix_acl_access", "trusted.x"] {
            let n = CString::new(name).unwrap();
            assert_eq!(
                libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 16),
                -1
            );
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EOPNOTSUPP),
                "{name}"
            );
        }
        assert_eq!(
            set(&CString::new("trusted.x").unwrap(), 0),
            libc::EOPNOTSUPP
        );
    }
    // A write past the largest file lode keeps is refused at once.
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(m("big")).unwrap();
        assert_eq!(errno_of(f.write_at(b"x", 1 << 60)), libc::EFBIG);
    }

    // Rename over an open file, and unlink of an open file: the open handles still read.
    fs::write(m("ckpt"), b"old version").unwrap();
    let mut old = fs::File::open(m("ckpt")).unwrap();
    fs::write(m("ckpt.tmp"), b"new version").unwrap();
    fs::rename(m("ckpt.tmp"), m("ckpt")).unwrap();
    let mut s = String::new();
    old.read_to_string(&mut s).unwrap();
    assert_eq!(s, "old version");
    assert_eq!(fs::read(m("ckpt")).unwrap(), b"new version");
    let mut open = fs::File::open(m("ckpt")).unwrap();
    fs::remove_file(m("ckpt")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut s = String::new();
    open.read_to_string(&mut s).unwrap();
    assert_eq!(s, "new version");

    // Another user: a 0600 file of root's is refused, a 0644 one is not.
    fs::write(m("private"), b"secret").unwrap();
    fs::set_permissions(m("private"), fs::Permissions::from_mode(0o600)).unwrap();
    let as_user = |path: PathBuf| {
        Command::new("cat")
            .arg(path)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    assert!(!as_user(m("private")).status.success());
    assert!(as_user(m("d/x")).status.success());

    // flock between two processes of this mount: the second waits for the first.
    let (ok, out) = sh(&mnt, "touch lockf && flock lockf sh -c 'sleep 0.5; echo first >> lockorder' & sleep 0.1; flock lockf sh -c 'echo second >> lockorder'; wait; cat lockorder");
    assert!(ok && out == "first\nsecond\n", "flock order: {out:?}");
    // O_DIRECT and 1 MiB requests.
    let (ok, out) = sh(&mnt, "dd if=/dev/zero of=direct bs=1M count=8 oflag=direct status=none && dd if=direct of=/dev/null bs=1M iflag=direct status=none && stat -c %s direct");
    assert!(ok && out.trim() == "8388608", "O_DIRECT: {out}");

    // lode setstripe/getstripe on paths inside the mount.
    let lode = |args: &[&str]| {
        Command::new(
            std::env::current_exe()
                .unwrap()
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("lode"),
        )
        .args(args)
        .env("LODE_KEY", lode_tests::client_key_file())
        .output()
        .unwrap()
    };
    let out = lode(&[
        "setstripe",
        "-c",
        "2",
        "-S",
        "1M",
        m("striped").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lode(&["getstripe", m("striped").to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("lmm_stripe_count:  2") && text.contains("lmm_stripe_size:   1048576"),
        "{text}"
    );
    assert!(m("striped").exists());
    // The layout as an extended attribute: shown, and set on an empty file.
    let (ok, out) = sh(&mnt, "getfattr --only-values -n lode.layout striped 2>/dev/null || python3 -c \"import os; print(os.getxattr('striped', 'lode.layout').decode())\"");
    assert!(
        ok && out.starts_with("-c 2 -S 1048576"),
        "layout xattr: {out:?}"
    );
    fs::write(m("empty"), b"").unwrap();
    let (ok, out) = sh(&mnt, "python3 -c \"import os; os.setxattr('empty', 'lode.layout', b'-c 1 -S 2M'); print(os.getxattr('empty', 'lode.layout').decode())\"");
    assert!(
        ok && out.starts_with("-c 1 -S 2097152"),
        "set layout xattr: {out:?}"
    );

    // FIFOs, sockets and device nodes keep their kind and device number; a FIFO passes data.
    let (ok, out) = sh(&mnt, "mkfifo fifo && mknod cdev c 1 3 && mknod bdev b 7 0 && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\" && stat -c '%F %t:%T' fifo cdev bdev sock && (echo through > fifo &) && cat fifo");
    assert!(
        ok && out == "fifo 0:0\ncharacter special file 1:3\nblock special file 7:0\nsocket 0:0\nthrough\n",
        "special files: {out:?}"
    );
    // fallocate extends, punching a hole zeroes a range and keeps the size, files pass 4 GiB.
    let (ok, out) = sh(&mnt, "printf 'abcdefgh%.0s' $(seq 1 1024) > holey && fallocate -l 16384 holey && fallocate -p -o 4 -l 8000 holey && stat -c %s holey && head -c 8 holey | od -An -c && tail -c +8004 holey | head -c 4 | od -An -c");
    assert!(
        ok && out == "16384\n   a   b   c   d  \\0  \\0  \\0  \\0\n  \\0   e   f   g\n",
        "fallocate: {out:?}"
    );
    let (ok, out) = sh(&mnt, "printf tail | dd of=huge bs=1 seek=6442450944 status=none && stat -c %s huge && tail -c 4 huge && dd if=huge bs=1M skip=6143 count=1 status=none | od -An -c | head -1");
    assert!(
        ok && out.starts_with("6442450948\ntail") && out.contains("\\0"),
        "a 6 GiB sparse file: {out:?}"
    );
    // Times: another user may set "now" with write permission, other times only as owner.
    fs::write(m("shared"), b"x").unwrap();
    fs::set_permissions(m("shared"), fs::Permissions::from_mode(0o666)).unwrap();
    let touch = |args: &[&str]| {
        Command::new("touch")
            .args(args)
            .arg(m("shared"))
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(touch(&[]));
    assert!(!touch(&["-d", "2001-01-01"]));

    // A second mount of the same filesystem: close-to-open, and ls -l from readdirplus.
    let mnt2 = root.join("mnt2");
    fs::create_dir_all(&mnt2).unwrap();
    let second = Server::start(
        "lode",
        &[
            "--mds",
            &mds.nid.to_string(),
            "mount",
            mnt2.to_str().unwrap(),
        ],
    )
    .unwrap();
    fs::write(m("cto"), b"one").unwrap();
    assert_eq!(fs::read(mnt2.join("cto")).unwrap(), b"one");
    fs::write(m("cto"), b"version two").unwrap();
    assert_eq!(fs::read(mnt2.join("cto")).unwrap(), b"version two");
    assert_eq!(fs::metadata(mnt2.join("cto")).unwrap().len(), 11);
    let (ok, out) = sh(&mnt2, "ls -ln d | tail -1");
    assert!(
        ok && out.starts_with("-rw-r--r-- 1 0 0 1 "),
        "ls -l: {out:?}"
    );
    assert!(second.terminate().success());

    // Real tools.
    let (ok, out) = sh(
        &mnt,
        "tar -cf - -C /usr/share/doc tar | tar -xf - && diff -r /usr/share/doc/tar tar",
    );
    assert!(ok, "tar round trip: {out}");
    let (ok, out) = sh(
        &mnt,
        "cp -a /usr/share/doc/tar cpa && diff -r /usr/share/doc/tar cpa",
    );
    assert!(ok, "cp -a: {out}");
    if Path::new("/usr/bin/rsync").exists() {
        let (ok, out) = sh(
            &mnt,
            "rsync -a /usr/share/doc/tar/ rs/ && diff -r /usr/share/doc/tar rs",
        );
        assert!(ok, "rsync: {out}");
    }
    let src = root.join("src");
    let (ok, out) = sh(&root, &format!(
        "git init -q {0} && cd {0} && echo x > f && git add f && git -c user.email=t@t -c user.name=t commit -qm one && cd {1} && git clone -q {0} repo && cd repo && test -z \"$(git status --porcelain)\"",
        src.display(), mnt.display()
    ));
    assert!(ok, "git clone and status: {out}");
    let (ok, out) = sh(&mnt, "python3 -c \"import os,shutil; os.makedirs('py/a/b'); open('py/a/b/f','w').write('d'*5000); shutil.copytree('py/a','py/c'); shutil.move('py/c','py/d'); assert os.stat('py/d/b/f').st_size==5000; shutil.rmtree('py')\"");
    assert!(ok, "python os and shutil: {out}");
    let mut f = fs::File::create(m("done")).unwrap();
    f.write_all(b"ok").unwrap();
    drop(f);

    // SIGTERM unmounts cleanly.
    drop((old, open));
    assert!(mount.terminate().success());
    assert!(!mounted(&mnt));
    let _ = fs::remove_dir_all(&root);
}

/// With `no_default_permissions` the daemon checks every call as its caller: a directory root
/// listed (so that its lease is held and the kernel caches the listing) still cannot be listed
/// by a user who may not read it, from the daemon's cache or the kernel's, while its entries
/// stay reachable by name; once the mode allows it, the same user lists it.
#[test]
fn a_directory_the_caller_may_not_read_is_listed_from_no_cache() {
    let Some((mnt, _mds, _oss, mount, _unmount)) =
        one_server_mount("dir-perm", "allow_other,no_default_permissions")
    else {
        return;
    };
    let d = mnt.join("private");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("secret"), b"x").unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o711)).unwrap();
    for _ in 0..3 {
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
    }
    for _ in 0..3 {
        let ls = as_nobody("ls", &d);
        assert!(
            !ls.status.success() && String::from_utf8_lossy(&ls.stderr).contains("ermission"),
            "listed by a user who may not read it: {ls:?}"
        );
        let cat = as_nobody("cat", &d.join("secret"));
        assert!(cat.status.success() && cat.stdout == b"x", "{cat:?}");
    }
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    let ls = as_nobody("ls", &d);
    assert!(ls.status.success() && String::from_utf8_lossy(&ls.stdout).contains("secret"));
    assert!(mount.terminate().success());
}

/// By default the kernel checks permissions too, and opens directories without asking the
/// daemon: names it cached for root are not reached by a user who may not search their
/// directory, a directory that user may not read is not listed from the kernel's cache, and a
/// listing read while other entries come and go shows every entry that stays exactly once.
#[test]
fn the_kernel_checks_cached_names_and_lists_directories_it_opened_alone() {
    let Some((mnt, _mds, _oss, mount, _unmount)) = one_server_mount("kernel-checks", "allow_other")
    else {
        return;
    };
    let closed = mnt.join("closed");
    fs::create_dir(&closed).unwrap();
    fs::write(closed.join("secret"), b"x").unwrap();
    fs::set_permissions(closed.join("secret"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).unwrap();
    let hidden = mnt.join("hidden");
    fs::create_dir(&hidden).unwrap();
    fs::write(hidden.join("known"), b"y").unwrap();
    fs::set_permissions(&hidden, fs::Permissions::from_mode(0o711)).unwrap();
    for _ in 0..3 {
        // Cached in the kernel for root: the names, their attributes, the listings.
        assert_eq!(fs::read(closed.join("secret")).unwrap(), b"x");
        assert_eq!(fs::read_dir(&closed).unwrap().count(), 1);
        assert_eq!(fs::read_dir(&hidden).unwrap().count(), 1);
        for what in ["stat", "cat"] {
            let out = as_nobody(what, &closed.join("secret"));
            assert!(
                !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("ermission"),
                "{what} reached a name in a directory its caller may not search: {out:?}"
            );
        }
        let ls = as_nobody("ls", &hidden);
        assert!(
            !ls.status.success() && String::from_utf8_lossy(&ls.stderr).contains("ermission"),
            "listed by a user who may not read it: {ls:?}"
        );
        let cat = as_nobody("cat", &hidden.join("known"));
        assert!(cat.status.success() && cat.stdout == b"y", "{cat:?}");
    }
    fs::set_permissions(&hidden, fs::Permissions::from_mode(0o755)).unwrap();
    let ls = as_nobody("ls", &hidden);
    assert!(ls.status.success() && String::from_utf8_lossy(&ls.stdout).contains("known"));

    // A running program opened read-only with O_TRUNC: ETXTBSY, and the program keeps its
    // bytes (the kernel checks before it truncates).
    let prog = mnt.join("prog");
    fs::copy("/bin/sleep", &prog).unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
    let len = fs::metadata(&prog).unwrap().len();
    let mut running = std::process::Command::new(&prog).arg("30").spawn().unwrap();
    use std::os::unix::fs::OpenOptionsExt;
    let trunc = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(&prog);
    assert_eq!(errno_of(trunc), libc::ETXTBSY);
    assert_eq!(
        fs::metadata(&prog).unwrap().len(),
        len,
        "truncated while it ran"
    );
    assert!(running.try_wait().unwrap().is_none(), "the program died");
    running.kill().unwrap();
    running.wait().unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&prog)
        .unwrap();
    f.write_all(b"#!/bin/sh\n").unwrap();
    drop(f);
    assert_eq!(
        fs::metadata(&prog).unwrap().len(),
        10,
        "truncated once it no longer ran"
    );

    // A directory's times move with each create and unlink made here, answered ahead or not,
    // and a file's attributes are there from its create on.
    let t = mnt.join("times");
    fs::create_dir(&t).unwrap();
    let mut last = fs::metadata(&t).unwrap().modified().unwrap();
    for i in 0..50 {
        std::thread::sleep(Duration::from_millis(2));
        let p = t.join(format!("f{i}"));
        let f = fs::File::create(&p).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0);
        drop(f);
        if i % 2 == 1 {
            fs::remove_file(&p).unwrap();
        }
        let now = fs::metadata(&t).unwrap().modified().unwrap();
        assert!(now > last, "change {i}: the directory's mtime did not move");
        last = now;
    }
    assert_eq!(fs::read_dir(&t).unwrap().count(), 25);

    // Listings read over many requests while another process adds and removes other names.
    let d = mnt.join("many");
    fs::create_dir(&d).unwrap();
    let stay: std::collections::BTreeSet<String> = (0..3000)
        .map(|i| format!("stays-with-a-long-name-{i:05}"))
        .collect();
    for n in &stay {
        fs::File::create(d.join(n)).unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let p = d.join(format!("comes-and-goes-{}", i % 50));
                if i % 100 < 50 {
                    fs::File::create(&p).unwrap();
                } else {
                    let _ = fs::remove_file(&p);
                }
                i += 1;
            }
        })
    };
    for round in 0..20 {
        let mut seen = std::collections::BTreeMap::<String, u32>::new();
        for e in fs::read_dir(&d).unwrap() {
            *seen
                .entry(e.unwrap().file_name().into_string().unwrap())
                .or_default() += 1;
        }
        for n in &stay {
            assert_eq!(
                seen.get(n),
                Some(&1),
                "round {round}: {n} listed other than once"
            );
        }
        assert!(
            seen.keys()
                .all(|n| stay.contains(n) || n.starts_with("comes-and-goes-")),
            "round {round}: a name never made"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
    fs::File::create(d.join("last")).unwrap();
    assert_eq!(
        fs::read_dir(&d)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name() == "last")
            .count(),
        1,
        "a name made through the mount shows in its next listing"
    );
    assert!(mount.terminate().success());
}

/// Runs `cmd arg` as nobody.
fn as_nobody(cmd: &str, arg: &Path) -> std::process::Output {
    Command::new(cmd)
        .arg(arg)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap()
}

/// Lazily unmounts a mount point when dropped, so that a test that fails leaves no dead
/// mount behind (one that ends well has unmounted already).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.0)
                .status();
        }
    }
}

/// A cluster of one storage server and a mount of it, for the buffered-write test; the last
/// part unmounts it when dropped.
fn one_server_mount(name: &str, opts: &str) -> Option<(PathBuf, Server, Server, Server, Unmount)> {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return None;
    }
    let root = scratch(name);
    let mds = mds_of(&root);
    let oss = Server::start(
        "lode-oss",
        &[
            "--data-dir",
            root.join("oss").to_str().unwrap(),
            "--mds",
            &mds.nid.to_string(),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .unwrap();
    let mnt = root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mount = Server::start(
        "lode",
        &[
            "--mds",
            &mds.nid.to_string(),
            "mount",
            mnt.to_str().unwrap(),
            "-o",
            opts,
        ],
    )
    .unwrap();
    assert!(mounted(&mnt));
    let unmount = Unmount(mnt.clone());
    Some((mnt, mds, oss, mount, unmount))
}

/// A second mount of `mds`'s cluster, beside `mnt` (at `other`); the last part unmounts it
/// when dropped.
fn second_mount(mds: &Server, mnt: &Path) -> (PathBuf, Server, Unmount) {
    let other = mnt.parent().unwrap().join("other");
    fs::create_dir_all(&other).unwrap();
    let second = Server::start(
        "lode",
        &[
            "--mds",
            &mds.nid.to_string(),
            "mount",
            other.to_str().unwrap(),
        ],
    )
    .unwrap();
    let unmount = Unmount(other.clone());
    (other, second, unmount)
}

// One mount, one scenario, in order: what other processes see of buffered writes, set-ID bits
// dropped by another user's write, then the storage server lost under pending writes.
#[test]
fn buffered_writes_show_to_other_processes_and_their_failures_surface_at_fsync_and_close() {
    buffered_writes_scenario("mount-buffered", "allow_other,default_permissions");
}

// The same through the kernel's write-back cache: the kernel keeps the size and mtime, places
// appends, and writes back before fsync and close, which still report the lost writes.
#[test]
fn under_the_write_back_cache_buffered_writes_show_and_fail_the_same() {
    buffered_writes_scenario(
        "mount-writeback",
        "allow_other,default_permissions,writeback",
    );
}

fn buffered_writes_scenario(name: &str, opts: &str) {
    use std::os::fd::IntoRawFd;
    let Some((mnt, _mds, oss, mount, _unmount)) = one_server_mount(name, opts) else {
        return;
    };
    let m = |p: &str| mnt.join(p);
    let stat = |p: &str| {
        let (ok, out) = sh(&mnt, &format!("stat -c '%s %Y' {p}"));
        assert!(ok, "{out}");
        let mut it = out.split_whitespace().map(|v| v.parse::<i64>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };

    // Size and mtime, seen by another process before and after fsync.
    let mut f = fs::File::create(m("w")).unwrap();
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..3 {
        f.write_all(&chunk).unwrap();
    }
    let (size, mtime) = stat("w");
    assert_eq!(size, 3 << 20, "size before fsync");
    assert!(mtime >= t0 - 1, "mtime before fsync: {mtime} < {t0}");
    f.sync_all().unwrap();
    assert_eq!(stat("w").0, 3 << 20, "size after fsync");
    f.set_len(1000).unwrap();
    assert_eq!(stat("w").0, 1000, "size after ftruncate");
    let mut a = fs::OpenOptions::new().append(true).open(m("w")).unwrap();
    a.write_all(b"tail").unwrap();
    assert_eq!(stat("w").0, 1004, "size after an append");
    drop(a);
    let back = fs::read(m("w")).unwrap();
    assert!(back[..1000].iter().all(|&b| b == 7) && &back[1000..] == b"tail");

    // Appends from several processes at once (`>>`, each an open, a write and a close): every
    // line whole, none over another.
    let (ok, out) = sh(
        &mnt,
        "for w in 1 2 3; do (for i in $(seq 10 39); do echo w$w-$i >> apps; done) & done; wait",
    );
    assert!(ok, "{out}");
    let apps = String::from_utf8(fs::read(m("apps")).unwrap()).unwrap();
    let mut lines: Vec<&str> = apps.lines().collect();
    lines.sort();
    let want: Vec<String> = (1..=3)
        .flat_map(|w| (10..40).map(move |i| format!("w{w}-{i}")))
        .collect();
    assert_eq!(lines, want, "appends of three processes");

    // One file written in interleaved, unaligned records by four threads, two through one
    // handle each and two opening and closing a handle per record: a close forgets nothing
    // another handle has gathered or in flight.
    {
        use std::os::unix::fs::FileExt;
        const B: u64 = 47008;
        let path = m("strided");
        fs::File::create(&path).unwrap();
        let record = |p: u64, i: u64| -> Vec<u8> {
            (0..B)
                .map(|k| ((p * 31 + i * 7 + k) % 251 + 1) as u8)
                .collect()
        };
        std::thread::scope(|s| {
            for p in 0..4u64 {
                let path = &path;
                s.spawn(move || {
                    let open = || fs::OpenOptions::new().write(true).open(path).unwrap();
                    let mut kept = (p < 2).then(open);
                    for i in 0..40u64 {
                        let once = kept.is_none().then(open);
                        let f = kept.as_ref().or(once.as_ref()).unwrap();
                        f.write_all_at(&record(p, i), (i * 4 + p) * B).unwrap();
                    }
                    if let Some(f) = kept.take() {
                        f.sync_all().unwrap();
                    }
                });
            }
        });
        let back = fs::read(&path).unwrap();
        assert_eq!(back.len() as u64, 160 * B);
        for i in 0..40u64 {
            for p in 0..4u64 {
                let at = ((i * 4 + p) * B) as usize;
                assert!(
                    back[at..at + B as usize] == record(p, i)[..],
                    "record {i} of writer {p} at {at}"
                );
            }
        }
    }

    // A write by another user clears the set-user-ID and set-group-ID bits.
    fs::write(m("suid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(m("suid"), fs::Permissions::from_mode(0o6777)).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("echo x >> {}", m("suid").display()))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::metadata(m("suid")).unwrap().mode() & 0o7777,
        0o0777,
        "set-ID bits survived another user's write"
    );

    // The storage server goes away under acknowledged-but-unsynced writes: fsync reports it,
    // and so does close.
    let mut g = fs::File::create(m("g")).unwrap();
    g.write_all(&chunk).unwrap();
    g.sync_all().unwrap();
    oss.kill();
    f.write_all(&chunk).unwrap();
    g.write_all(&chunk).unwrap();
    let err = f.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "fsync: {err}");
    let fd = g.into_raw_fd();
    // SAFETY: `fd` is ours (taken from the File) and closed once.
    let r = unsafe { libc::close(fd) };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EIO)),
        "close"
    );
    drop(f);
    assert!(mount.terminate().success());
}

// Readers of several files at once through a mount whose readahead memory is two chunks: the
// windows share the budget, every stream still makes progress, and every byte is right.
#[test]
fn streams_beyond_the_readahead_budget_still_read_every_byte() {
    use std::os::fd::AsRawFd;
    let Some((mnt, _mds, _oss, mount, _unmount)) =
        one_server_mount("mount-budget", "allow_other,readahead_memory_mb=2")
    else {
        return;
    };
    let pattern = |seed: u8, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
            .collect()
    };
    let len = 9 << 20 | 12345;
    for seed in 0..3u8 {
        let p = mnt.join(format!("f{seed}"));
        // Written and synced, so that a failed write is seen here and not as a bad read.
        let mut f = fs::File::create(&p).unwrap();
        f.write_all(&pattern(seed, len)).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a valid descriptor; the advice only drops clean cached pages.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let readers: Vec<_> = (0..3u8)
        .map(|seed| {
            let p = mnt.join(format!("f{seed}"));
            std::thread::spawn(move || {
                let mut f = fs::File::open(&p).unwrap();
                let mut got = vec![];
                let mut buf = vec![0u8; 128 << 10];
                loop {
                    let n = f.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                (seed, got)
            })
        })
        .collect();
    for r in readers {
        let (seed, got) = r.join().unwrap();
        assert_eq!(got.len(), len, "file {seed}: length");
        let want = pattern(seed, len);
        if let Some(at) = (0..len).find(|&i| got[i] != want[i]) {
            let bad = (at..len).filter(|&i| got[i] != want[i]).count();
            let again = fs::read(mnt.join(format!("f{seed}"))).unwrap() == want;
            panic!(
                "file {seed}: {bad} bytes differ from offset {at} on; read again whole: {}",
                if again { "right" } else { "still wrong" }
            );
        }
    }
    assert!(mount.terminate().success());
}

/// The threads of `pid` whose name starts with `prefix`, with the times each went to sleep
/// (voluntary context switches: one per request a ring thread waited for and served, about).
fn threads_named(pid: u32, prefix: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let waits = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        out.push((comm.trim().to_owned(), waits));
    }
    out
}

/// What a mount must do the same over FUSE rings and over /dev/fuse: many small creates, a
/// file larger than a ring entry's payload written and read back, a long listing, an xattr
/// whose value fills a good part of a payload, renames and unlinks.
fn ring_workload(m: &Path) {
    for i in 0..300 {
        fs::write(m.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let big: Vec<u8> = (0..3_000_007u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(m.join("big"), &big).unwrap();
    assert!(fs::read(m.join("big")).unwrap() == big);
    assert_eq!(fs::read_dir(m).unwrap().count(), 301);
    let c = CString::new(m.join("big").to_str().unwrap()).unwrap();
    let v = CString::new("user.large").unwrap();
    let value: Vec<u8> = (0..32_768u32).map(|i| (i % 199) as u8).collect();
    let mut back = vec![0u8; 65_536];
    // SAFETY: valid C strings and buffers of the given lengths.
    let got = unsafe {
        assert_eq!(
            libc::setxattr(
                c.as_ptr(),
                v.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0
            ),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
        libc::getxattr(c.as_ptr(), v.as_ptr(), back.as_mut_ptr().cast(), back.len())
    };
    assert_eq!(got, value.len() as isize);
    assert_eq!(&back[..value.len()], &value[..]);
    for i in 0..300 {
        fs::rename(m.join(format!("f{i}")), m.join(format!("g{i}"))).unwrap();
        assert_eq!(
            fs::read_to_string(m.join(format!("g{i}"))).unwrap(),
            i.to_string()
        );
        fs::remove_file(m.join(format!("g{i}"))).unwrap();
    }
    fs::remove_file(m.join("big")).unwrap();
    assert_eq!(fs::read_dir(m).unwrap().count(), 0);
}

// A mount serves over FUSE rings where the kernel has them (turning the fuse module's switch on,
// as root), one pinned thread per CPU, and the same calls give the same results as a mount told
// to stay on /dev/fuse, which starts no ring.
#[test]
fn a_mount_serves_over_fuse_rings_where_the_kernel_has_them_and_gives_the_same_results() {
    let Some((ring_mnt, _mds, _oss, ring_mount, _unmount)) =
        one_server_mount("ring", "allow_other")
    else {
        return;
    };
    let Some((dev_mnt, _mds2, _oss2, dev_mount, _unmount2)) =
        one_server_mount("no-ring", "no_uring")
    else {
        return;
    };
    let before: u64 = threads_named(ring_mount.child.id(), "fuser-ring-")
        .iter()
        .map(|t| t.1)
        .sum();
    ring_workload(&ring_mnt);
    ring_workload(&dev_mnt);

    let rings = threads_named(ring_mount.child.id(), "fuser-ring-");
    let kernel_has_rings = Path::new("/sys/module/fuse/parameters/enable_uring").exists();
    if kernel_has_rings {
        let cpus = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
        let last: usize = cpus
            .trim()
            .split(',')
            .filter_map(|r| r.rsplit('-').next()?.parse().ok())
            .max()
            .unwrap();
        assert_eq!(rings.len(), last + 1, "one ring thread per CPU: {rings:?}");
        let served: u64 = rings.iter().map(|t| t.1).sum::<u64>() - before;
        // 300 creates, 300 renames and 300 unlinks, each at least one request.
        assert!(served >= 900, "the rings served {served} requests");
    } else {
        eprintln!("this kernel has no FUSE rings: the mount serves over /dev/fuse");
        assert!(rings.is_empty());
    }
    assert!(threads_named(dev_mount.child.id(), "fuser-ring-").is_empty());
    // Both unmount and exit on SIGTERM: the kernel ends the ring entries with the connection.
    assert!(ring_mount.terminate().success());
    assert!(dev_mount.terminate().success());
    assert!(!mounted(&ring_mnt) && !mounted(&dev_mnt));
}

// Small writes that follow one another are gathered by the mount into one write to the
// storage servers; mixed with jumps, overlapping rewrites and reads through the mount in
// between, the file ends byte for byte as a local copy written the same way.
#[test]
fn gathered_small_writes_mixed_with_jumps_overlaps_and_reads_give_the_same_bytes_as_a_local_file() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let drop_pages = |f: &fs::File| {
        // Written pages are clean (the mount writes through); reads after this go to the
        // daemon, which waits for the file's writes and reads what the servers hold.
        // SAFETY: a valid descriptor; the advice only drops clean cached pages.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    };
    let Some((mnt, _mds, _oss, mount, _unmount)) = one_server_mount("gather", "allow_other") else {
        return;
    };
    let local_dir = scratch("gather-local");
    fs::create_dir_all(&local_dir).unwrap();
    let open = |p: PathBuf| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)
            .unwrap()
    };
    let (a, b) = (open(mnt.join("f")), open(local_dir.join("f")));
    // A second handle of the mount's file: the writes go through either, each breaking off
    // what the other gathered.
    let a2 = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("f"))
        .unwrap();
    // A fixed pseudo-random sequence: the same case every run.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    // First every way a write can meet the gathered ones, in quick succession: reaching
    // before them and ending inside, inside, past their end, and the last byte then the whole.
    // Far past where the steps below write, so that they stay to be compared at the end.
    let far = 10_000_000u64;
    for (o, n, v) in [
        (10_000u64, 4096usize, 1u8),
        (9_950, 100, 2),
        (12_000, 10, 3),
        (14_090, 50, 4),
        (30_000, 1, 5),
        (27_953, 2048, 6),
    ] {
        a.write_all_at(&vec![v; n], far + o).unwrap();
        b.write_all_at(&vec![v; n], far + o).unwrap();
    }
    let sizes = [1u64, 17, 512, 4000, 4096, 65_536, 131_072, 200_000];
    let mut off = 0u64;
    for i in 0..4000 {
        match next(12) {
            0..=5 => {}
            6..=7 => off = next(3_000_000),
            // A step back over what was just written (overlapping the gathered bytes, or
            // reaching before them).
            8..=9 => off = off.saturating_sub(1 + next(10_000)),
            _ => {
                let (o, n) = (next(3_000_000), 1 + next(20_000) as usize);
                // From the storage servers, not from the pages the writes left in the kernel.
                drop_pages(&a);
                let (mut ra, mut rb) = (vec![0u8; n], vec![0u8; n]);
                let ga = a.read_at(&mut ra, o).unwrap();
                let gb = b.read_at(&mut rb, o).unwrap();
                assert!(ga == gb && ra[..ga] == rb[..gb], "step {i}: a read at {o}");
                continue;
            }
        }
        let n = sizes[next(sizes.len() as u64) as usize] as usize;
        let data: Vec<u8> = (0..n).map(|_| next(256) as u8).collect();
        let through = if next(2) == 0 { &a } else { &a2 };
        through.write_all_at(&data, off).unwrap();
        b.write_all_at(&data, off).unwrap();
        off += n as u64;
    }
    // Two writers of one shared file in turns, each every other 47,008-byte piece (IO500's
    // ior-hard), the pieces of each pair written in either order.
    let shared = 20_000_000u64;
    for pair in 0..300u64 {
        let piece =
            |k: u64| -> Vec<u8> { (0..47_008u64).map(|j| (k * 31 + j % 251) as u8).collect() };
        let mut order = [(0u64, &a), (1, &a2)];
        if next(2) == 0 {
            order.swap(0, 1);
        }
        for (k, through) in order {
            let at = shared + (pair * 2 + k) * 47_008;
            through.write_all_at(&piece(pair * 2 + k), at).unwrap();
            b.write_all_at(&piece(pair * 2 + k), at).unwrap();
        }
    }
    a2.sync_all().unwrap();
    drop(a2);
    // Before close: the size and every byte; then after close and a new open.
    assert_eq!(a.metadata().unwrap().len(), b.metadata().unwrap().len());
    a.sync_all().unwrap();
    drop_pages(&a);
    drop(a);
    assert!(fs::read(mnt.join("f")).unwrap() == fs::read(local_dir.join("f")).unwrap());
    assert!(mount.terminate().success());
    let _ = fs::remove_dir_all(&local_dir);
}

/// A small file opened to be read is read from its open on; what that read brought is used
/// only while nothing wrote to the file since: a write through another handle, closed again
/// before the read, is seen.
#[test]
fn a_small_file_read_from_its_open_on_still_shows_writes_made_after_the_open() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let Some((mnt, _mds, _oss, _mount, _unmount)) = one_server_mount("first-read", "allow_other")
    else {
        return;
    };
    let p = mnt.join("small");
    let old: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&p, &old).unwrap();
    assert_eq!(fs::read(&p).unwrap(), old, "read whole from its open on");
    for round in 0..2u8 {
        let r = fs::File::open(&p).unwrap();
        // Another handle writes over part of it, and closes.
        let mut new = fs::read(&p).unwrap();
        let changed = vec![0xA0 + round; 3000];
        let w = fs::OpenOptions::new().write(true).open(&p).unwrap();
        w.write_all_at(&changed, 5_000).unwrap();
        w.sync_all().unwrap();
        drop(w);
        new[5_000..8_000].copy_from_slice(&changed);
        // The read goes to the daemon, not to pages the write left in the kernel.
        // SAFETY: a valid descriptor; the advice only drops clean cached pages.
        unsafe { libc::posix_fadvise(r.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let mut got = vec![0u8; 20_000];
        let n = r.read_at(&mut got, 0).unwrap();
        let differs = got[..n].iter().zip(&new).position(|(a, b)| a != b);
        assert_eq!(
            (n, differs),
            (new.len(), None),
            "round {round}: bytes read, first that differs"
        );
    }
}

/// A file made, cut or extended, and written through one handle reads back whole through
/// another, and an extension made through one handle (ftruncate, truncate by path, fallocate)
/// reads as zeros through handles opened before it, not as the end of the file: a read
/// answered short would also move the kernel's size down, and a mapping of the file would then
/// fault past it.
#[test]
fn sizes_changed_through_one_handle_are_read_through_every_other() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let Some((mnt, _mds, _oss, _mount, _unmount)) = one_server_mount("resized", "allow_other")
    else {
        return;
    };
    // Made here, cut, then written: a new open reads what the first handle wrote.
    let p = mnt.join("made");
    let data: Vec<u8> = (0..4097u32).map(|i| (i % 251) as u8).collect();
    let w = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    w.set_len(3905).unwrap();
    w.write_all_at(&data, 0).unwrap();
    assert_eq!(
        fs::read(&p).unwrap(),
        data,
        "a new open of a file made, cut and written"
    );
    drop(w);
    // Extended through one handle while another is open.
    let q = mnt.join("extended");
    for how in ["ftruncate", "truncate", "fallocate"] {
        fs::write(&q, b"0123456789").unwrap();
        let a = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&q)
            .unwrap();
        let b = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&q)
            .unwrap();
        match how {
            "ftruncate" => b.set_len(100_000).unwrap(),
            "truncate" => {
                let c = std::ffi::CString::new(q.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path.
                assert_eq!(unsafe { libc::truncate(c.as_ptr(), 100_000) }, 0);
            }
            _ => {
                // SAFETY: a valid descriptor.
                let r = unsafe { libc::fallocate(b.as_raw_fd(), 0, 0, 100_000) };
                assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
            }
        }
        let mut got = vec![0xFFu8; 4096];
        let n = a.read_at(&mut got, 50_000).unwrap();
        assert_eq!(
            (n, got.iter().all(|&x| x == 0)),
            (4096, true),
            "{how}: bytes read past the old end through another handle, all zeros"
        );
        assert_eq!(a.metadata().unwrap().len(), 100_000, "{how}: the size");
    }
}

/// Small files made through the mount are read back from the mount's own copy of their bytes
/// (the kernel keeps no page a write covered in part): that copy holds every write, overlaps
/// and holes included, and gives way to a size change, an append, and another client's write.
#[test]
fn small_files_made_here_read_back_whole_through_every_kind_of_change() {
    use std::os::unix::fs::FileExt;
    let Some((mnt, mds, _oss, _mount, _unmount)) = one_server_mount("copies", "allow_other") else {
        return;
    };
    let make = |name: &str, writes: &[(u64, &[u8])]| {
        let f = fs::File::create_new(mnt.join(name)).unwrap();
        for (at, data) in writes {
            f.write_all_at(data, *at).unwrap();
        }
    };
    make("a", &[(0, b"hello world"), (6, b"XY")]);
    assert_eq!(fs::read(mnt.join("a")).unwrap(), b"hello XYrld");

    let pattern: Vec<u8> = (0..3901u32).map(|i| (i % 251) as u8 + 1).collect();
    make("b", &[(0, &pattern)]);
    let b = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("b"))
        .unwrap();
    b.set_len(100).unwrap();
    b.set_len(3901).unwrap();
    drop(b);
    let mut want = pattern[..100].to_vec();
    want.resize(3901, 0);
    assert!(
        fs::read(mnt.join("b")).unwrap() == want,
        "truncated, then grown"
    );

    make("c", &[(0, b"a"), (5000, b"b")]);
    let mut want = vec![0u8; 5001];
    (want[0], want[5000]) = (b'a', b'b');
    assert!(
        fs::read(mnt.join("c")).unwrap() == want,
        "a hole reads as zeros"
    );

    let mut d = fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(mnt.join("d"))
        .unwrap();
    d.write_all(b"12").unwrap();
    d.write_all(b"34").unwrap();
    drop(d);
    assert_eq!(fs::read(mnt.join("d")).unwrap(), b"1234");

    // Another client writes over the start of a file made here (its lease is recalled first).
    make("e", &[(0, b"hello world")]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let other = lode_tests::client_riding_restarts(&mds.nid).await;
        let f = client::OpenOptions::new()
            .write(true)
            .open(&other, "/e")
            .await
            .unwrap();
        f.write_at(0, b"HELLO").await.unwrap();
        f.close().await.unwrap();
    });
    assert_eq!(fs::read(mnt.join("e")).unwrap(), b"HELLO world");
}

/// Unmounts the small filesystem a storage server's targets live on, when dropped.
struct SmallDisk(PathBuf);

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

// The storage server's disk fills under writes the mount acknowledged before they landed. The
// failure is reported, and what could not be kept is never read back as zeros: the file holds
// exactly the bytes that landed, through this mount and a fresh one.
#[test]
fn writes_lost_to_a_full_disk_are_reported_and_never_read_back_as_zeros() {
    use std::os::fd::IntoRawFd;
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let root = scratch("mount-full");
    let disk = root.join("oss");
    fs::create_dir_all(&disk).unwrap();
    let made = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(made.success(), "mounting a small tmpfs for the targets");
    let _disk = SmallDisk(disk.clone());
    let mds = mds_of(&root);
    let _oss = Server::start(
        "lode-oss",
        &[
            "--data-dir",
            disk.to_str().unwrap(),
            "--mds",
            &mds.nid.to_string(),
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .unwrap();
    let mount_at = |dir: &str| {
        let mnt = root.join(dir);
        fs::create_dir_all(&mnt).unwrap();
        let m = Server::start(
            "lode",
            &[
                "--mds",
                &mds.nid.to_string(),
                "mount",
                mnt.to_str().unwrap(),
            ],
        )
        .unwrap();
        assert!(mounted(&mnt));
        (mnt.clone(), m, Unmount(mnt))
    };
    let (mnt, mount, _unmount) = mount_at("mnt");
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253 + 1) as u8).collect();
    let path = mnt.join("filling");
    let mut f = fs::File::create(&path).unwrap();
    let (mut acknowledged, mut failed) = (0u64, None);
    for _ in 0..128 {
        match f.write_all(&chunk) {
            Ok(()) => acknowledged += 1,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let synced = f.sync_all();
    // Every byte the file holds is one that was written: none reads as zero.
    let check = |p: &Path, who: &str| {
        let back = fs::read(p).unwrap();
        assert!(
            back.len() as u64 <= acknowledged << 20,
            "{who}: {} bytes, past the {acknowledged} MiB acknowledged",
            back.len()
        );
        assert!(!back.is_empty(), "{who}: nothing of the file was kept");
        for (k, piece) in back.chunks(1 << 20).enumerate() {
            assert!(
                piece == &chunk[..piece.len()],
                "{who}: MiB {k} of {} is not what was written",
                back.len() >> 20
            );
        }
        back.len()
    };
    // Once the loss is known, the writer's own mount shows none of the lost bytes, even while
    // the writing handle is still open.
    if failed.is_some() || synced.is_err() {
        check(&path, "this mount, the writer still open");
    }
    let fd = f.into_raw_fd();
    // SAFETY: `fd` is ours (taken from the File) and closed once.
    let closed = unsafe { libc::close(fd) };
    let reported = failed.is_some() || synced.is_err() || closed != 0;
    assert!(reported, "128 MiB went to a 48 MiB disk and nothing failed");

    let here = check(&path, "this mount");
    let (other, other_mount, _other_unmount) = mount_at("other");
    assert_eq!(check(&other.join("filling"), "a fresh mount"), here);

    // Room made again, the filesystem takes writes as before.
    fs::remove_file(&path).unwrap();
    let again = mnt.join("again");
    let four = chunk.repeat(4);
    let mut ok = false;
    for _ in 0..50 {
        // The removed file's objects go at the MDS's next maintenance pass.
        std::thread::sleep(Duration::from_millis(200));
        // Synced: a small new file's close returns before its writes land.
        let wrote = fs::File::create(&again).and_then(|mut g| {
            g.write_all(&four)?;
            g.sync_all()
        });
        if wrote.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "no write succeeded after the space was freed");
    let back = fs::read(&again).unwrap();
    let first = back.iter().zip(&four).position(|(a, b)| a != b);
    assert!(
        back == four,
        "read back {} bytes of {}, first differing at {first:?}",
        back.len(),
        four.len()
    );
    assert!(other_mount.terminate().success());
    assert!(mount.terminate().success());
}

// Times set outright through the handle that wrote the file, before it is closed (cp -a and
// tar do so), stay once it is closed, as the writing mount and another one see them.
#[test]
fn an_mtime_set_before_the_close_survives_it() {
    let Some((mnt, mds, _oss, mount, _unmount)) =
        one_server_mount("mount-times", "allow_other,default_permissions")
    else {
        return;
    };
    let (other, second, _second_unmount) = second_mount(&mds, &mnt);
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    let sizes = [("small", 5000usize), ("large", 3 << 20)];
    for (name, len) in sizes {
        let mut f = fs::File::create(mnt.join(name)).unwrap();
        f.write_all(&vec![7u8; len]).unwrap();
        f.set_modified(when).unwrap();
        drop(f);
    }
    // The closes finish behind the callers: their work is done by now.
    std::thread::sleep(Duration::from_secs(1));
    for (name, len) in sizes {
        for m in [&mnt, &other] {
            let md = fs::metadata(m.join(name)).unwrap();
            assert_eq!(md.len(), len as u64, "{name} through {}", m.display());
            assert_eq!(
                md.modified().unwrap(),
                when,
                "{name} through {}",
                m.display()
            );
        }
    }
    assert!(second.terminate().success());
    assert!(mount.terminate().success());
}

/// `linkat` of `fd`'s file (through /proc, as `linkat(2)`'s O_TMPFILE example does) to `to`.
fn link_fd(fd: i32, to: &Path) -> std::io::Result<()> {
    let from = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
    let to = CString::new(to.to_str().unwrap()).unwrap();
    // SAFETY: both are valid C strings for the call's duration.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: an all-zero statvfs is valid, and `c` outlives the call.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s
}

// O_TMPFILE as editors, package managers and databases use it: a file written with no name,
// then named at once by a link (an atomic publish), or dropped by closing it. And the files
// df -i counts.
#[test]
fn a_file_made_with_no_name_is_named_by_a_link_or_gone_after_its_close() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let Some((mnt, mds, _oss, _mount, _unmount)) =
        one_server_mount("mount-tmpfile", "allow_other,default_permissions")
    else {
        return;
    };
    let dir = mnt.join("d");
    fs::create_dir(&dir).unwrap();
    let tmp = |excl: bool| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o640)
            .custom_flags(libc::O_TMPFILE | if excl { libc::O_EXCL } else { 0 })
            .open(&dir)
            .unwrap()
    };
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut f = tmp(false);
    f.write_all(&data).unwrap();
    let md = f.metadata().unwrap();
    assert_eq!(
        (md.len(), md.nlink(), md.mode() & 0o7777),
        (3_000_000, 0, 0o640)
    );
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "it has no name");
    link_fd(f.as_raw_fd(), &dir.join("named")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    f.write_all(b"tail").unwrap();
    drop(f);
    let mut want = data.clone();
    want.extend_from_slice(b"tail");
    // Seen whole by another mount, which never saw it without its name.
    let (other, second, _second_unmount) = second_mount(&mds, &mnt);
    assert_eq!(fs::read(other.join("d/named")).unwrap(), want);
    // O_EXCL: never to be named, as the kernel decides.
    let f = tmp(true);
    assert_eq!(
        errno_of(link_fd(f.as_raw_fd(), &dir.join("no"))),
        libc::ENOENT
    );
    drop(f);
    // Files never named are gone some seconds after their last close: df -i counts them
    // until then, and never reports more files used than there are.
    let before = statvfs(&mnt);
    assert!(before.f_files >= before.f_ffree, "df -i: {before:?}");
    let used = |s: &libc::statvfs| s.f_files - s.f_ffree;
    for _ in 0..20 {
        let mut f = tmp(false);
        f.write_all(&[1; 10_000]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1100)); // the mount answers statfs from a cache
    let during = used(&statvfs(&mnt));
    assert!(
        during >= used(&before) + 20,
        "{during} used, {} before",
        used(&before)
    );
    let start = std::time::Instant::now();
    while used(&statvfs(&mnt)) > used(&before) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "files with no name still counted 30 s after their close"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
    drop(second);
}

// An operator's background mount: it returns once mounted, its log goes to the file asked
// for (plain lines, no terminal colours), and a mount that cannot start fails at once with
// the reason rather than after the 20 s wait.
#[test]
fn a_background_mount_logs_to_its_file_and_fails_early_when_it_cannot_start() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let root = scratch("mount-daemon");
    let mds = mds_of(&root);
    let mnt = root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let log = root.join("mount.log");
    let lode = |args: &[&str]| {
        Command::new(bin("lode"))
            .env("LODE_KEY", client_key_file())
            .env("LODE_LOG", "info")
            .args(["--mds", &mds.nid.to_string()])
            .args(args)
            .output()
            .unwrap()
    };
    let out = lode(&[
        "mount",
        "--daemon",
        "--log-file",
        log.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let out_first = out;
    let _unmount = Unmount(mnt.clone());
    assert!(mounted(&mnt));
    fs::write(mnt.join("f"), b"x").unwrap();
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("mounted"), "the log: {text}");
    assert!(
        !text.contains('\x1b'),
        "terminal colours in a log file: {text}"
    );
    assert_eq!(
        fs::metadata(&log).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // A background process that cannot start (here: a key of another cluster) ends, and the
    // caller hears of it at once, pointed to the log.
    let other_key = root.join("other.key");
    let made = lode(&["key", "new", other_key.to_str().unwrap()]);
    assert!(made.status.success(), "{made:?}");
    let second = root.join("second");
    fs::create_dir_all(&second).unwrap();
    let start = std::time::Instant::now();
    let out = Command::new(bin("lode"))
        .env("LODE_KEY", &other_key)
        .args([
            "--mds",
            &mds.nid.to_string(),
            "mount",
            "--daemon",
            "--log-file",
        ])
        .arg(&log)
        .arg(&second)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("ended") && said.contains("mount.log"),
        "{said}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    assert!(!mounted(&second));

    // Taken away from outside and mounted again on the same directory, the first process sees
    // that its own mount is gone and ends; the second serves on.
    let first = pid_said(&out_first);
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    let again = lode(&[
        "mount",
        "--daemon",
        "--log-file",
        log.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ]);
    assert!(again.status.success(), "{again:?}");
    let next = pid_said(&again);
    assert!(
        ends_within(first, Duration::from_secs(10)),
        "the first mount's process {first} still runs"
    );
    fs::create_dir(mnt.join("d")).unwrap();
    assert!(mnt.join("f").exists());
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    assert!(ends_within(next, Duration::from_secs(10)));
}

/// The process a background `lode mount` said it started.
fn pid_said(out: &std::process::Output) -> u32 {
    let said = String::from_utf8_lossy(&out.stdout);
    said.rsplit_once("(process ")
        .and_then(|(_, rest)| rest.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no process in {said:?}"))
}

/// Whether process `pid` ends (is gone or a zombie: `kill -0` alone would still find one)
/// within `limit`.
fn ends_within(pid: u32, limit: Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        let gone = match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        };
        if gone {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// `lode cluster up --mdts 3` in `root` on `port`, taken down (and its directory removed) when
/// dropped.
struct ManyMdts {
    root: PathBuf,
    port: u16,
}

impl ManyMdts {
    fn lode(&self, args: &[&str]) -> (bool, String) {
        said(
            Command::new(bin("lode"))
                .args(args)
                .env("LODE_MDS", format!("127.0.0.1:{}", self.port))
                .env("LODE_KEY", self.root.join("client.key"))
                .output()
                .unwrap(),
        )
    }
}

impl Drop for ManyMdts {
    fn drop(&mut self) {
        let _ = self.lode(&["cluster", "down", "--dir", self.root.to_str().unwrap()]);
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// The mount over three MDTs: directories placed on each and striped over all, files and
/// directories renamed and linked between them through the kernel, `ls -lR` and `rm -r` as
/// on one MDS, and the MDTs checking clean against each other afterwards.
#[test]
fn a_mount_over_three_mdts_renames_links_and_lists_across_them() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let c = ManyMdts {
        root: scratch("mount-mdts"),
        port: 9795,
    };
    let d = c.root.to_str().unwrap().to_owned();
    let port = c.port.to_string();
    let (ok, out) = c.lode(&[
        "cluster", "up", "--dir", &d, "--port", &port, "--mdts", "3", "--oss", "2",
    ]);
    assert!(ok, "cluster up: {out}");
    let mnt = c.root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mds = format!("127.0.0.1:{port}@tcp");
    let key = c.root.join("client.key");
    let mount = Server::start(
        "lode",
        &[
            "--mds",
            &mds,
            "--key",
            key.to_str().unwrap(),
            "mount",
            mnt.to_str().unwrap(),
        ],
    )
    .unwrap();
    let unmount = Unmount(mnt.clone());
    assert!(mounted(&mnt));
    let m = |p: &str| mnt.join(p);
    for (args, what) in [
        (&["mkdir", "-i", "1", "/one"][..], "mkdir -i 1"),
        (&["mkdir", "-i", "2", "/two"][..], "mkdir -i 2"),
        (&["setdirstripe", "-c", "3", "/wide"][..], "setdirstripe"),
    ] {
        let (ok, out) = c.lode(args);
        assert!(ok, "{what}: {out}");
    }
    fs::write(m("one/f"), b"file f\n").unwrap();
    fs::create_dir(m("one/sub")).unwrap();
    fs::write(m("one/sub/x"), b"in sub\n").unwrap();
    for i in 0..12 {
        fs::write(m(&format!("wide/h{i}")), format!("h{i}")).unwrap();
    }
    let f = fs::metadata(m("one/f")).unwrap();

    // A file's name and a directory moved between MDTs, the inode the same.
    fs::rename(m("one/f"), m("two/f")).unwrap();
    assert_eq!(fs::metadata(m("two/f")).unwrap().ino(), f.ino());
    assert_eq!(fs::read(m("two/f")).unwrap(), b"file f\n");
    fs::rename(m("one/sub"), m("two/sub")).unwrap();
    assert_eq!(fs::read(m("two/sub/x")).unwrap(), b"in sub\n");
    fs::rename(m("two/sub"), m("wide/sub")).unwrap();
    assert_eq!(fs::read(m("wide/sub/x")).unwrap(), b"in sub\n");
    assert_eq!(errno_of(fs::metadata(m("one/sub"))), libc::ENOENT);
    // Never below itself.
    assert_eq!(
        errno_of(fs::rename(m("wide"), m("wide/sub/in"))),
        libc::EINVAL
    );
    // A hard link from another MDT, counted on the file.
    fs::hard_link(m("two/f"), m("one/f.link")).unwrap();
    assert_eq!(fs::metadata(m("two/f")).unwrap().nlink(), 2);
    assert_eq!(fs::read(m("one/f.link")).unwrap(), b"file f\n");

    let (ok, out) = sh(&mnt, "ls -lR . | grep -c '^-'");
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "15", "files listed by ls -lR"); // f, f.link, x, h0..h11
    let (ok, out) = sh(&mnt, "rm -r one two wide && ls -A");
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "");
    drop(mount);
    drop(unmount);
    let (ok, out) = c.lode(&["cluster", "down", "--dir", &d]);
    assert!(ok, "cluster down: {out}");
    let checked = Command::new(bin("lode-mds"))
        .args(["fsck", "--data-dir"])
        .arg(c.root.join("mds"))
        .arg("--data-dir")
        .arg(c.root.join("mdt1"))
        .arg("--data-dir")
        .arg(c.root.join("mdt2"))
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.success() && printed.contains("across the 3 MDTs: 0 problems"),
        "{printed}{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}
