//! The namespace's operations and their errors, as POSIX defines them.

use mds::namespace::*;
use proto::layout::{Component, Layout, StripeCount};

const T0: Time = Time { sec: 100, nsec: 5 };

fn t(n: i64) -> Time {
    Time {
        sec: 100 + n,
        nsec: 7,
    }
}

fn user(uid: u32) -> Creds {
    Creds {
        uid,
        gid: uid,
        groups: vec![],
    }
}

struct Fs {
    ns: Namespace,
    clock: i64,
}

impl Fs {
    fn new() -> Fs {
        Fs {
            ns: Namespace::new(T0),
            clock: 0,
        }
    }

    fn run(&mut self, m: Mutation, who: &Creds) -> Result<Applied, NsError> {
        self.clock += 1;
        let before = self.ns.clone();
        let r = self.ns.apply(&m, who, t(self.clock));
        if r.is_err() {
            assert_eq!(self.ns, before, "a failed operation changed the namespace");
        }
        assert_eq!(
            self.ns.check(),
            Vec::<String>::new(),
            "invariants after {m:?}"
        );
        r
    }

    fn create(
        &mut self,
        parent: proto::Fid,
        name: &str,
        kind: Kind,
        who: &Creds,
    ) -> Result<Inode, NsError> {
        let target = if kind == Kind::Symlink {
            b"target".to_vec()
        } else {
            vec![]
        };
        let m = Mutation::Create {
            parent,
            name: name.into(),
            kind,
            mode: if kind == Kind::Dir { 0o755 } else { 0o644 },
            exclusive: true,
            target,
            layout: None,
        };
        self.run(m, who).map(|a| a.inode.unwrap())
    }

    fn errno(&mut self, m: Mutation, who: &Creds) -> i32 {
        self.run(m, who).unwrap_err().errno()
    }
}

fn rename(parent: proto::Fid, name: &str, new_parent: proto::Fid, new_name: &str) -> Mutation {
    Mutation::Rename {
        parent,
        name: name.into(),
        new_parent,
        new_name: new_name.into(),
        flags: RenameFlags::default(),
    }
}

#[test]
fn create_lookup_and_readdir() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let d = fs.create(ROOT, "d", Kind::Dir, &root).unwrap();
    let f = fs.create(d.fid, "f", Kind::File, &root).unwrap();
    let s = fs.create(d.fid, "s", Kind::Symlink, &root).unwrap();
    assert_eq!(fs.ns.lookup(d.fid, b"f", &root).unwrap().fid, f.fid);
    assert_eq!(fs.ns.lookup(d.fid, b"..", &root).unwrap().fid, ROOT);
    assert_eq!(fs.ns.inode(s.fid).unwrap().target, b"target");
    assert_eq!(fs.ns.inode(ROOT).unwrap().nlink, 3);
    assert_eq!(
        fs.ns.inode(d.fid).unwrap().mtime,
        t(3),
        "the directory's mtime follows its last change"
    );
    let page = fs.ns.readdir(d.fid, None, 10, &root).unwrap();
    assert_eq!(
        page.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        vec![b"f".to_vec(), b"s".to_vec()]
    );
    // Exclusive create of an existing name, and non-exclusive open of it.
    let again = Mutation::Create {
        parent: d.fid,
        name: b"f".to_vec(),
        kind: Kind::File,
        mode: 0o600,
        exclusive: false,
        target: vec![],
        layout: None,
    };
    assert_eq!(fs.run(again, &root).unwrap().inode.unwrap().fid, f.fid);
    assert_eq!(
        fs.create(d.fid, "f", Kind::File, &root)
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
}

#[test]
fn readdir_resumes_across_changes_without_skips_or_repeats() {
    let mut fs = Fs::new();
    let root = Creds::root();
    for i in 0..10 {
        fs.create(ROOT, &format!("n{i}"), Kind::File, &root)
            .unwrap();
    }
    let first = fs.ns.readdir(ROOT, None, 4, &root).unwrap();
    let cookie = first.last().unwrap().0.clone();
    // Meanwhile: an entry before the cookie goes, one after it goes, a new one appears.
    fs.run(
        Mutation::Unlink {
            parent: ROOT,
            name: b"n1".to_vec(),
            dir: false,
        },
        &root,
    )
    .unwrap();
    fs.run(
        Mutation::Unlink {
            parent: ROOT,
            name: b"n8".to_vec(),
            dir: false,
        },
        &root,
    )
    .unwrap();
    fs.create(ROOT, "n55", Kind::File, &root).unwrap();
    let rest = fs.ns.readdir(ROOT, Some(&cookie), 100, &root).unwrap();
    let mut names: Vec<_> = first
        .iter()
        .chain(&rest)
        .map(|e| String::from_utf8(e.0.clone()).unwrap())
        .collect();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "no entry twice");
    for kept in ["n0", "n2", "n3", "n4", "n5", "n6", "n7", "n9"] {
        assert!(names.contains(&kept.to_owned()), "{kept} was skipped");
    }
}

#[test]
fn bad_names_are_refused() {
    let mut fs = Fs::new();
    let root = Creds::root();
    for (name, errno) in [
        ("", libc::EINVAL),
        (".", libc::EINVAL),
        ("..", libc::EINVAL),
        ("a/b", libc::EINVAL),
        ("a\0b", libc::EINVAL),
    ] {
        assert_eq!(
            fs.create(ROOT, name, Kind::File, &root)
                .unwrap_err()
                .errno(),
            errno,
            "{name:?}"
        );
    }
    assert_eq!(
        fs.create(ROOT, &"x".repeat(256), Kind::File, &root)
            .unwrap_err()
            .errno(),
        libc::ENAMETOOLONG
    );
    fs.create(ROOT, &"x".repeat(255), Kind::File, &root)
        .unwrap();
    let stale = proto::Fid::new(INODE_SEQ, 999, 0);
    assert_eq!(
        fs.create(stale, "a", Kind::File, &root)
            .unwrap_err()
            .errno(),
        libc::ESTALE
    );
    let f = fs.create(ROOT, "f", Kind::File, &root).unwrap();
    assert_eq!(
        fs.create(f.fid, "a", Kind::File, &root)
            .unwrap_err()
            .errno(),
        libc::ENOTDIR
    );
}

#[test]
fn unlink_and_rmdir_follow_posix() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let d = fs.create(ROOT, "d", Kind::Dir, &root).unwrap();
    let f = fs.create(d.fid, "f", Kind::File, &root).unwrap();
    assert_eq!(
        fs.errno(
            Mutation::Unlink {
                parent: ROOT,
                name: b"d".to_vec(),
                dir: true
            },
            &root
        ),
        libc::ENOTEMPTY
    );
    assert_eq!(
        fs.errno(
            Mutation::Unlink {
                parent: ROOT,
                name: b"d".to_vec(),
                dir: false
            },
            &root
        ),
        libc::EISDIR
    );
    assert_eq!(
        fs.errno(
            Mutation::Unlink {
                parent: d.fid,
                name: b"f".to_vec(),
                dir: true
            },
            &root
        ),
        libc::ENOTDIR
    );
    assert_eq!(
        fs.errno(
            Mutation::Unlink {
                parent: d.fid,
                name: b"zz".to_vec(),
                dir: false
            },
            &root
        ),
        libc::ENOENT
    );
    let gone = fs
        .run(
            Mutation::Unlink {
                parent: d.fid,
                name: b"f".to_vec(),
                dir: false,
            },
            &root,
        )
        .unwrap();
    assert_eq!(
        gone.removed.iter().map(|i| i.fid).collect::<Vec<_>>(),
        vec![f.fid]
    );
    fs.run(
        Mutation::Unlink {
            parent: ROOT,
            name: b"d".to_vec(),
            dir: true,
        },
        &root,
    )
    .unwrap();
    assert_eq!(fs.ns.inode(ROOT).unwrap().nlink, 2);
}

#[test]
fn hard_links_count_and_the_last_unlink_removes() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let f = fs.create(ROOT, "a", Kind::File, &root).unwrap();
    let linked = fs
        .run(
            Mutation::Link {
                fid: f.fid,
                parent: ROOT,
                name: b"b".to_vec(),
            },
            &root,
        )
        .unwrap();
    assert_eq!(linked.inode.unwrap().nlink, 2);
    let d = fs.create(ROOT, "d", Kind::Dir, &root).unwrap();
    assert_eq!(
        fs.errno(
            Mutation::Link {
                fid: d.fid,
                parent: ROOT,
                name: b"e".to_vec()
            },
            &root
        ),
        libc::EPERM
    );
    assert_eq!(
        fs.errno(
            Mutation::Link {
                fid: f.fid,
                parent: ROOT,
                name: b"b".to_vec()
            },
            &root
        ),
        libc::EEXIST
    );
    let first = fs
        .run(
            Mutation::Unlink {
                parent: ROOT,
                name: b"a".to_vec(),
                dir: false,
            },
            &root,
        )
        .unwrap();
    assert!(first.removed.is_empty());
    assert_eq!(fs.ns.inode(f.fid).unwrap().nlink, 1);
    let last = fs
        .run(
            Mutation::Unlink {
                parent: ROOT,
                name: b"b".to_vec(),
                dir: false,
            },
            &root,
        )
        .unwrap();
    assert_eq!(last.removed.len(), 1);
}

#[test]
fn rename_replaces_atomically_and_refuses_what_posix_refuses() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let a = fs.create(ROOT, "a", Kind::Dir, &root).unwrap();
    let b = fs.create(a.fid, "b", Kind::Dir, &root).unwrap();
    let old = fs.create(ROOT, "ckpt", Kind::File, &root).unwrap();
    let new = fs.create(ROOT, "ckpt.tmp", Kind::File, &root).unwrap();
    // Over an existing file: the name now holds the new file; the old one is removed.
    let r = fs
        .run(rename(ROOT, "ckpt.tmp", ROOT, "ckpt"), &root)
        .unwrap();
    assert_eq!(
        r.removed.iter().map(|i| i.fid).collect::<Vec<_>>(),
        vec![old.fid]
    );
    assert_eq!(fs.ns.lookup(ROOT, b"ckpt", &root).unwrap().fid, new.fid);
    assert_eq!(
        fs.ns.lookup(ROOT, b"ckpt.tmp", &root).unwrap_err().errno(),
        libc::ENOENT
    );
    // A directory below itself; file over directory; directory over file; non-empty target.
    assert_eq!(fs.errno(rename(ROOT, "a", b.fid, "x"), &root), libc::EINVAL);
    assert_eq!(fs.errno(rename(ROOT, "a", a.fid, "x"), &root), libc::EINVAL);
    assert_eq!(
        fs.errno(rename(ROOT, "ckpt", a.fid, "b"), &root),
        libc::EISDIR
    );
    assert_eq!(
        fs.errno(rename(a.fid, "b", ROOT, "ckpt"), &root),
        libc::ENOTDIR
    );
    let c = fs.create(ROOT, "c", Kind::Dir, &root).unwrap();
    fs.create(c.fid, "inside", Kind::File, &root).unwrap();
    assert_eq!(
        fs.errno(rename(a.fid, "b", ROOT, "c"), &root),
        libc::ENOTEMPTY
    );
    // Over an empty directory, across directories.
    let e = fs.create(ROOT, "e", Kind::Dir, &root).unwrap();
    fs.run(rename(a.fid, "b", ROOT, "e"), &root).unwrap();
    assert!(fs.ns.inode(e.fid).is_err());
    assert_eq!(fs.ns.lookup(ROOT, b"e", &root).unwrap().fid, b.fid);
    assert_eq!(fs.ns.lookup(b.fid, b"..", &root).unwrap().fid, ROOT);
    // A name renamed to itself, or to another name of the same inode, changes nothing.
    fs.run(rename(ROOT, "ckpt", ROOT, "ckpt"), &root).unwrap();
}

#[test]
fn noreplace_and_exchange() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let x = fs.create(ROOT, "x", Kind::File, &root).unwrap();
    let d = fs.create(ROOT, "d", Kind::Dir, &root).unwrap();
    let nr = |a: &str, b: &str, noreplace, exchange| Mutation::Rename {
        parent: ROOT,
        name: a.into(),
        new_parent: ROOT,
        new_name: b.into(),
        flags: RenameFlags {
            noreplace,
            exchange,
        },
    };
    assert_eq!(fs.errno(nr("x", "d", true, false), &root), libc::EEXIST);
    assert_eq!(fs.errno(nr("x", "zz", false, true), &root), libc::ENOENT);
    assert_eq!(fs.errno(nr("x", "d", true, true), &root), libc::EINVAL);
    fs.run(nr("x", "d", false, true), &root).unwrap();
    assert_eq!(fs.ns.lookup(ROOT, b"d", &root).unwrap().fid, x.fid);
    assert_eq!(fs.ns.lookup(ROOT, b"x", &root).unwrap().fid, d.fid);
    fs.run(nr("x", "y", true, false), &root).unwrap();
}

#[test]
fn permissions_for_other_users_and_sticky_directories() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let (alice, bob) = (user(1000), user(1001));
    assert_eq!(
        fs.create(ROOT, "a", Kind::File, &alice)
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
    let tmp = fs.create(ROOT, "tmp", Kind::Dir, &root).unwrap();
    let chmod = |fid, mode| Mutation::Setattr {
        fid,
        attr: SetAttr {
            mode: Some(mode),
            ..Default::default()
        },
    };
    fs.run(chmod(tmp.fid, 0o1777), &root).unwrap();
    let f = fs.create(tmp.fid, "alices", Kind::File, &alice).unwrap();
    assert_eq!(f.uid, 1000);
    assert_eq!(
        fs.errno(
            Mutation::Unlink {
                parent: tmp.fid,
                name: b"alices".to_vec(),
                dir: false
            },
            &bob
        ),
        libc::EPERM
    );
    assert_eq!(
        fs.errno(rename(tmp.fid, "alices", tmp.fid, "bobs"), &bob),
        libc::EPERM
    );
    assert_eq!(fs.errno(chmod(f.fid, 0o777), &bob), libc::EPERM);
    let chown = Mutation::Setattr {
        fid: f.fid,
        attr: SetAttr {
            uid: Some(1001),
            ..Default::default()
        },
    };
    assert_eq!(fs.errno(chown.clone(), &alice), libc::EPERM);
    fs.run(chown, &root).unwrap();
    // A private directory cannot be searched by others.
    let private = fs.create(tmp.fid, "private", Kind::Dir, &alice).unwrap();
    fs.run(chmod(private.fid, 0o700), &alice).unwrap();
    fs.create(private.fid, "secret", Kind::File, &alice)
        .unwrap();
    assert_eq!(
        fs.ns
            .lookup(private.fid, b"secret", &bob)
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
    assert_eq!(
        fs.ns
            .readdir(private.fid, None, 10, &bob)
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
    fs.run(
        Mutation::Unlink {
            parent: tmp.fid,
            name: b"alices".to_vec(),
            dir: false,
        },
        &bob,
    )
    .unwrap();
}

#[test]
fn setattr_changes_what_it_names_and_ctime() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let f = fs.create(ROOT, "f", Kind::File, &root).unwrap();
    let attr = SetAttr {
        size: Some(12345),
        atime: Some(Time {
            sec: 1 << 40,
            nsec: 999_999_999,
        }),
        ..Default::default()
    };
    let after = fs
        .run(Mutation::Setattr { fid: f.fid, attr }, &root)
        .unwrap()
        .inode
        .unwrap();
    assert_eq!(after.size, 12345);
    assert_eq!(
        after.atime,
        Time {
            sec: 1 << 40,
            nsec: 999_999_999
        },
        "64-bit seconds and nanoseconds"
    );
    assert!(after.ctime > f.ctime);
    let d = fs.create(ROOT, "d", Kind::Dir, &root).unwrap();
    let trunc = |fid, size| Mutation::Setattr {
        fid,
        attr: SetAttr {
            size: Some(size),
            ..Default::default()
        },
    };
    assert_eq!(fs.errno(trunc(d.fid, 0), &root), libc::EISDIR);
    assert_eq!(fs.errno(trunc(f.fid, u64::MAX), &root), libc::EFBIG);
}

#[test]
fn user_xattrs() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let f = fs.create(ROOT, "f", Kind::File, &root).unwrap();
    let set = |name: &str, value: &[u8]| Mutation::SetXattr {
        fid: f.fid,
        name: name.into(),
        value: value.to_vec(),
    };
    fs.run(set("user.tag", b"v1"), &root).unwrap();
    assert_eq!(fs.ns.inode(f.fid).unwrap().xattrs["user.tag"], b"v1");
    assert_eq!(fs.errno(set("trusted.x", b"v"), &root), libc::EOPNOTSUPP);
    assert_eq!(
        fs.errno(set("user.big", &vec![0; 70_000]), &root),
        libc::E2BIG
    );
    assert_eq!(
        fs.errno(
            Mutation::RemoveXattr {
                fid: f.fid,
                name: "user.none".into()
            },
            &root
        ),
        libc::ENODATA
    );
    // XATTR_CREATE and XATTR_REPLACE: checked with the change, in one step.
    let only = |name: &str, value: &[u8], replace| Mutation::SetXattrIf {
        fid: f.fid,
        name: name.into(),
        value: value.to_vec(),
        replace,
    };
    assert_eq!(
        fs.errno(only("user.tag", b"v2", false), &root),
        libc::EEXIST
    );
    assert_eq!(fs.errno(only("user.new", b"v", true), &root), libc::ENODATA);
    assert!(!fs.ns.inode(f.fid).unwrap().xattrs.contains_key("user.new"));
    fs.run(only("user.tag", b"v2", true), &root).unwrap();
    fs.run(only("user.new", b"n", false), &root).unwrap();
    let x = &fs.ns.inode(f.fid).unwrap().xattrs;
    assert_eq!(
        (&x["user.tag"][..], &x["user.new"][..]),
        (&b"v2"[..], &b"n"[..])
    );
    fs.run(
        Mutation::RemoveXattr {
            fid: f.fid,
            name: "user.tag".into(),
        },
        &root,
    )
    .unwrap();
}

#[test]
fn a_directory_default_layout_is_inherited_and_absurd_layouts_refused() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let layout = Layout::new(vec![Component::raid0(StripeCount::Count(4), 1 << 20)]).unwrap();
    let mk = |name: &str, kind, layout| Mutation::Create {
        parent: ROOT,
        name: name.into(),
        kind,
        mode: 0o755,
        exclusive: true,
        target: vec![],
        layout,
    };
    let d = fs
        .run(mk("d", Kind::Dir, Some(layout.clone())), &root)
        .unwrap()
        .inode
        .unwrap();
    let sub = fs.create(d.fid, "sub", Kind::Dir, &root).unwrap();
    let f = fs.create(sub.fid, "f", Kind::File, &root).unwrap();
    assert_eq!(
        f.layout,
        Some(layout.clone()),
        "inherited through a subdirectory"
    );
    let mut bad = layout;
    bad.components[0].stripe_size = 1000;
    assert_eq!(
        fs.errno(mk("g", Kind::File, Some(bad)), &root),
        libc::EINVAL
    );
}

#[test]
fn writers_grow_the_size_to_the_furthest_end() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let f = fs.create(ROOT, "shared", Kind::File, &root).unwrap();
    // Two writers of disjoint ranges report in either order: the size is the furthest end.
    fs.run(
        Mutation::GrowSize {
            fid: f.fid,
            size: 8 << 20,
        },
        &root,
    )
    .unwrap();
    fs.run(
        Mutation::GrowSize {
            fid: f.fid,
            size: 4 << 20,
        },
        &root,
    )
    .unwrap();
    assert_eq!(fs.ns.inode(f.fid).unwrap().size, 8 << 20);
    let d = fs.create(ROOT, "d", Kind::Dir, &root).unwrap();
    assert_eq!(
        fs.errno(
            Mutation::GrowSize {
                fid: d.fid,
                size: 1
            },
            &root
        ),
        libc::EINVAL
    );
    assert_eq!(
        fs.errno(
            Mutation::GrowSize {
                fid: f.fid,
                size: u64::MAX
            },
            &root
        ),
        libc::EFBIG
    );
    assert_eq!(
        fs.errno(
            Mutation::GrowSize {
                fid: f.fid,
                size: 1
            },
            &user(1000)
        ),
        libc::EACCES
    );
}

#[test]
fn a_layout_is_set_only_on_an_empty_file() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let f = fs.create(ROOT, "f", Kind::File, &root).unwrap();
    let layout = Layout::new(vec![Component::raid0(StripeCount::Count(2), 1 << 20)]).unwrap();
    let set = |fid, layout: &Layout| Mutation::SetLayout {
        fid,
        layout: layout.clone(),
    };
    let after = fs.run(set(f.fid, &layout), &root).unwrap().inode.unwrap();
    assert_eq!(after.layout.unwrap().components, layout.components);
    fs.run(
        Mutation::GrowSize {
            fid: f.fid,
            size: 10,
        },
        &root,
    )
    .unwrap();
    assert_eq!(fs.errno(set(f.fid, &layout), &root), libc::EEXIST);
    let mut bad = layout.clone();
    bad.components[0].stripe_count = StripeCount::Count(5000);
    let g = fs.create(ROOT, "g", Kind::File, &root).unwrap();
    assert_eq!(fs.errno(set(g.fid, &bad), &root), libc::EINVAL);
}

#[test]
fn removed_files_objects_wait_in_the_destroy_queue() {
    use proto::layout::StripeObject;
    let mut fs = Fs::new();
    let root = Creds::root();
    let mut layout = Layout::new(vec![Component::raid0(StripeCount::Count(1), 1 << 20)]).unwrap();
    let obj = StripeObject {
        target: 3,
        fid: proto::Fid::new(0x1_0000_0003, 42, 0),
    };
    layout.components[0].objects = vec![obj];
    let m = Mutation::Create {
        parent: ROOT,
        name: b"f".to_vec(),
        kind: Kind::File,
        mode: 0o644,
        exclusive: true,
        target: vec![],
        layout: Some(layout),
    };
    fs.run(m, &root).unwrap();
    assert_eq!(fs.ns.highest_object(3, 0), 42);
    assert_eq!(fs.ns.highest_object(3, 1), 0, "another MDT's sequence");
    assert!(fs.ns.doomed(10, |_| false).is_empty());
    fs.run(
        Mutation::Unlink {
            parent: ROOT,
            name: b"f".to_vec(),
            dir: false,
        },
        &root,
    )
    .unwrap();
    assert_eq!(fs.ns.doomed(10, |_| false), vec![obj]);
    assert_eq!(
        fs.ns.highest_object(3, 0),
        42,
        "a queued object still counts: it is not an orphan"
    );
    fs.run(Mutation::Destroyed { objects: vec![obj] }, &root)
        .unwrap();
    assert!(fs.ns.doomed(10, |_| false).is_empty());
}

#[test]
fn special_files_and_who_may_set_times() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let alice = user(1000);
    for (name, kind) in [
        ("fifo", Kind::Fifo),
        ("sock", Kind::Socket),
        ("null", Kind::CharDev(0x103)),
        ("loop0", Kind::BlockDev(0x700)),
    ] {
        let i = fs.create(ROOT, name, kind, &root).unwrap();
        assert_eq!(i.kind, kind);
        assert!(i.layout.is_none(), "{name} has no layout");
        let m = Mutation::SetLayout {
            fid: i.fid,
            layout: Layout::new(vec![Component::raid0(StripeCount::Count(1), 1 << 20)]).unwrap(),
        };
        assert_eq!(fs.errno(m, &root), libc::EINVAL);
    }
    assert_eq!(Kind::CharDev(0x103).rdev(), 0x103);
    // A file anyone may write: others may set its times to now, and no other time.
    let f = fs.create(ROOT, "shared", Kind::File, &root).unwrap();
    let chmod = Mutation::Setattr {
        fid: f.fid,
        attr: SetAttr {
            mode: Some(0o666),
            ..Default::default()
        },
    };
    fs.run(chmod, &root).unwrap();
    let times = |now: bool| Mutation::Setattr {
        fid: f.fid,
        attr: SetAttr {
            mtime: Some(t(50)),
            times_now: now,
            ..Default::default()
        },
    };
    fs.run(times(true), &alice).unwrap();
    assert_eq!(fs.errno(times(false), &alice), libc::EPERM);
    let private = fs.create(ROOT, "private", Kind::File, &root).unwrap();
    let now = Mutation::Setattr {
        fid: private.fid,
        attr: SetAttr {
            mtime: Some(t(50)),
            times_now: true,
            ..Default::default()
        },
    };
    assert_eq!(fs.errno(now, &alice), libc::EACCES);
}

fn create_file(name: &str, exclusive: bool) -> Mutation {
    Mutation::Create {
        parent: ROOT,
        name: name.into(),
        kind: Kind::File,
        mode: 0o644,
        exclusive,
        target: vec![],
        layout: None,
    }
}

#[test]
fn a_create_is_decided_before_anything_is_allocated_for_it() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let req = |seq| Some(ReqId { client: 7, seq });
    // A new name: the create goes ahead.
    assert_eq!(
        fs.ns.decide(&create_file("ckpt", true), &root, req(1)),
        Ok(Decision::Applies)
    );
    let (made, fresh) = fs
        .ns
        .apply_request(&create_file("ckpt", true), &root, t(1), req(1))
        .unwrap();
    assert!(fresh);
    // The same request again (a resend) gets its first reply, and applies nothing.
    assert_eq!(
        fs.ns.decide(&create_file("ckpt", true), &root, req(1)),
        Ok(Decision::Replied(made.clone()))
    );
    let before = fs.ns.clone();
    let (again, fresh) = fs
        .ns
        .apply_request(&create_file("ckpt", true), &root, t(2), req(1))
        .unwrap();
    assert!(!fresh && again == made && fs.ns == before);
    // open(O_CREAT) of the existing file (a checkpoint rewritten): opened, nothing to change.
    let inode = made.inode.unwrap();
    assert_eq!(
        fs.ns.decide(&create_file("ckpt", false), &root, req(2)),
        Ok(Decision::Opens(inode))
    );
    // O_EXCL of it, or O_CREAT over a directory, fails before any allocation.
    assert_eq!(
        fs.ns
            .decide(&create_file("ckpt", true), &root, req(3))
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    fs.create(ROOT, "d", Kind::Dir, &root).unwrap();
    assert_eq!(
        fs.ns
            .decide(&create_file("d", false), &root, req(4))
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    // Without write permission on the directory a new name is refused up front.
    assert_eq!(
        fs.ns
            .decide(&create_file("other", false), &user(1000), req(5))
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
}

#[test]
fn a_writer_who_is_not_the_owner_may_clear_set_id_bits_and_nothing_else() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let f = fs.create(ROOT, "f", Kind::File, &root).unwrap();
    let mode = |m| Mutation::Setattr {
        fid: f.fid,
        attr: SetAttr {
            mode: Some(m),
            ..Default::default()
        },
    };
    // Owned by root, setuid and setgid, writable by everyone.
    fs.run(mode(0o6777), &root).unwrap();
    let bob = user(1000);
    // Anything but dropping the set-ID bits is the owner's business.
    assert_eq!(fs.errno(mode(0o6755), &bob), libc::EPERM);
    assert_eq!(fs.errno(mode(0o0700), &bob), libc::EPERM);
    let after = fs.run(mode(0o0777), &bob).unwrap().inode.unwrap();
    assert_eq!(after.mode & 0o7777, 0o0777);
    // Once cleared, there is nothing left for a non-owner to change.
    assert_eq!(fs.errno(mode(0o0777), &bob), libc::EPERM);
    // A reader who may not write may not clear them either.
    fs.run(mode(0o6744), &root).unwrap();
    assert_eq!(fs.errno(mode(0o0744), &bob), libc::EPERM);
}

#[test]
fn bytes_on_the_mds_follow_writes_truncates_and_removal_and_survive_a_snapshot() {
    let mut fs = Fs::new();
    let root = Creds::root();
    let mdt = Component {
        end: 64 << 10,
        ..Component::raid0(StripeCount::Mdt, 64 << 10)
    };
    let layout = Layout::new(vec![mdt]).unwrap();
    let f = fs
        .run(
            Mutation::Create {
                parent: ROOT,
                name: "small".into(),
                kind: Kind::File,
                mode: 0o644,
                exclusive: true,
                target: vec![],
                layout: Some(layout),
            },
            &root,
        )
        .unwrap()
        .inode
        .unwrap();
    let write = |offset: u64, data: &[u8]| Mutation::WriteMdt {
        fid: f.fid,
        offset,
        data: data.to_vec(),
    };
    fs.run(write(10, b"hello"), &root).unwrap();
    assert_eq!(fs.ns.inode(f.fid).unwrap().size, 15);
    // What was never written reads as zeros; a read stops at the size.
    assert_eq!(
        fs.ns.read_mdt(f.fid, 0, 100).unwrap(),
        b"\0\0\0\0\0\0\0\0\0\0hello"
    );
    // A truncate drops what is past it, and growing again brings zeros back, not old bytes.
    let size = |s| Mutation::Setattr {
        fid: f.fid,
        attr: SetAttr {
            size: Some(s),
            ..Default::default()
        },
    };
    fs.run(size(12), &root).unwrap();
    fs.run(size(20), &root).unwrap();
    assert_eq!(
        fs.ns.read_mdt(f.fid, 10, 100).unwrap(),
        b"he\0\0\0\0\0\0\0\0"
    );
    // Past the MDS's part, too large, by someone who may not write, or on another file.
    assert_eq!(fs.errno(write(64 << 10, b"x"), &root), libc::EINVAL);
    let big = vec![1u8; proto::md::MAX_MDT_WRITE + 1];
    assert_eq!(fs.errno(write(0, &big), &root), libc::E2BIG);
    assert_eq!(fs.errno(write(0, b"x"), &user(1000)), libc::EACCES);
    let plain = fs.create(ROOT, "plain", Kind::File, &root).unwrap();
    let m = Mutation::WriteMdt {
        fid: plain.fid,
        offset: 0,
        data: b"x".to_vec(),
    };
    assert_eq!(fs.errno(m, &root), libc::EINVAL);

    // A snapshot keeps the bytes; one written before they existed still reads.
    let disk = mds::disk::MemDisk::new();
    mds::journal::write_snapshot(&disk, &fs.ns, 7).unwrap();
    let raw = mds::disk::MetaDisk::read(&disk, "snapshot")
        .unwrap()
        .unwrap();
    let (back, seq) = mds::journal::decode_snapshot(&raw).unwrap();
    assert_eq!(seq, 7);
    assert_eq!(back, fs.ns);
    assert_eq!(back.read_mdt(f.fid, 10, 2).unwrap(), b"he");
    let mut damaged = raw.clone();
    let at = damaged.len() - 1;
    damaged[at] ^= 1;
    assert!(mds::journal::decode_snapshot(&damaged).is_err());

    // The last name going keeps the file, its attributes and its bytes for the handles that
    // may hold it: named by nothing, still read and written by FID.
    let unlinked = fs
        .run(
            Mutation::Unlink {
                parent: ROOT,
                name: "small".into(),
                dir: false,
            },
            &root,
        )
        .unwrap();
    assert_eq!(unlinked.inode, None, "no name is left to answer with");
    assert_eq!(fs.ns.inode(f.fid).unwrap().nlink, 0);
    assert_eq!(
        fs.ns.lookup(ROOT, b"small", &root).unwrap_err().errno(),
        libc::ENOENT
    );
    fs.run(write(0, b"still"), &root).unwrap();
    assert_eq!(fs.ns.read_mdt(f.fid, 0, 12).unwrap(), b"still\0\0\0\0\0he");
    let later = t(1000);
    assert!(
        fs.ns.releasable(10, |_| true, later).is_empty(),
        "held open"
    );
    assert!(
        fs.ns.releasable(10, |_| false, t(fs.clock)).is_empty(),
        "removed just now: its opener may not be counted yet"
    );
    assert_eq!(fs.ns.releasable(10, |_| false, later), vec![f.fid]);
    // A snapshot keeps it, and it is found again as waiting to be released.
    mds::journal::write_snapshot(&disk, &fs.ns, 8).unwrap();
    let raw = mds::disk::MetaDisk::read(&disk, "snapshot")
        .unwrap()
        .unwrap();
    let (back, _) = mds::journal::decode_snapshot(&raw).unwrap();
    assert_eq!(back, fs.ns);
    assert_eq!(back.releasable(10, |_| false, later), vec![f.fid]);
    assert_eq!(back.check(), Vec::<String>::new());
    // Released once no handle holds it: the bytes go.
    fs.run(Mutation::Released { fids: vec![f.fid] }, &root)
        .unwrap();
    assert_eq!(
        fs.ns.read_mdt(f.fid, 0, 1).unwrap_err().errno(),
        libc::ESTALE
    );
    assert!(fs.ns.releasable(10, |_| false, later).is_empty());
    assert_eq!(fs.ns.check(), Vec::<String>::new());
    // A file without bytes on the MDS goes with its last name, as before.
    let plain2 = fs.create(ROOT, "plain2", Kind::File, &root).unwrap();
    fs.run(
        Mutation::Unlink {
            parent: ROOT,
            name: "plain2".into(),
            dir: false,
        },
        &root,
    )
    .unwrap();
    assert_eq!(fs.ns.inode(plain2.fid).unwrap_err().errno(), libc::ESTALE);
    assert!(fs.ns.releasable(10, |_| false, later).is_empty());
}

#[test]
fn a_file_made_with_no_name_is_kept_until_linked_or_released() {
    use proto::layout::StripeObject;
    let mut fs = Fs::new();
    let root = Creds::root();
    let alice = user(1000);
    let later = t(1000);
    let mut layout = Layout::new(vec![Component::raid0(StripeCount::Count(1), 1 << 20)]).unwrap();
    let obj = |oid| StripeObject {
        target: 0,
        fid: proto::Fid::new(0x1_0000_0000, oid, 0),
    };
    layout.components[0].objects = vec![obj(1)];
    let unnamed = |layout| Mutation::CreateUnnamed {
        parent: ROOT,
        mode: 0o600,
        layout: Some(layout),
    };
    // As a create in the directory would be: refused without write permission there.
    assert_eq!(fs.errno(unnamed(layout.clone()), &alice), libc::EACCES);
    let f = fs
        .run(unnamed(layout.clone()), &root)
        .unwrap()
        .inode
        .unwrap();
    assert_eq!((f.nlink, f.mode, f.kind), (0, 0o600, Kind::File));
    assert!(fs.ns.readdir(ROOT, None, 100, &root).unwrap().is_empty());
    assert_eq!(fs.ns.releasable(10, |_| false, later), vec![f.fid]);
    // A link names it (linkat of an O_TMPFILE): a file like any other from then on.
    let link = Mutation::Link {
        fid: f.fid,
        parent: ROOT,
        name: "kept".into(),
    };
    assert_eq!(fs.run(link, &root).unwrap().inode.unwrap().nlink, 1);
    assert!(fs.ns.releasable(10, |_| false, later).is_empty());
    assert_eq!(fs.ns.lookup(ROOT, b"kept", &root).unwrap().fid, f.fid);
    // One never named goes when released, its objects to the destroy queue.
    layout.components[0].objects = vec![obj(2)];
    let g = fs.run(unnamed(layout), &root).unwrap().inode.unwrap();
    assert!(fs.ns.doomed(10, |_| false).is_empty());
    fs.run(Mutation::Released { fids: vec![g.fid] }, &root)
        .unwrap();
    assert_eq!(fs.ns.inode(g.fid).unwrap_err().errno(), libc::ESTALE);
    assert_eq!(fs.ns.doomed(10, |_| false), vec![obj(2)]);
    // A release that comes again, or names a file with a name, changes nothing.
    let before = fs.ns.clone();
    fs.run(
        Mutation::Released {
            fids: vec![g.fid, f.fid],
        },
        &root,
    )
    .unwrap();
    assert_eq!(fs.ns, before);
}
