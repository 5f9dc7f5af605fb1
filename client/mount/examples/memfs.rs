//! The floor of a FUSE filesystem on this kernel, for benchmarks: every request answered from
//! memory on the thread that took it, mounted as lode's mount is (FUSE rings where the kernel
//! has them, `default_permissions`, the write-back cache, the same cache times; listings are plain
//! readdir).
//! What lode's mount costs above it is lode's; what it costs below a local filesystem is
//! FUSE's. Not a filesystem to keep anything in: it lives in this process and ends with it.
//!
//! `cargo run --release -p lode-mount --example memfs -- MOUNTPOINT` serves until unmounted
//! (`umount MOUNTPOINT`) or interrupted.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

/// What lode's mount gives the kernel for what it holds a lease on.
const TTL: Duration = Duration::from_secs(3600);

struct Node {
    attr: FileAttr,
    data: Vec<u8>,
    children: BTreeMap<OsString, u64>,
    parent: u64,
}

impl Node {
    fn new(attr: FileAttr, parent: u64) -> Node {
        Node {
            attr,
            data: Vec::new(),
            children: BTreeMap::new(),
            parent,
        }
    }
}

struct Tree {
    nodes: HashMap<u64, Node>,
    next: u64,
}

struct MemFs {
    tree: Mutex<Tree>,
}

fn new_attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl MemFs {
    fn new() -> MemFs {
        let root = new_attr(1, FileType::Directory, 0o777, 0, 0);
        let mut nodes = HashMap::new();
        nodes.insert(1, Node::new(root, 1));
        MemFs {
            tree: Mutex::new(Tree { nodes, next: 2 }),
        }
    }

    /// Adds `name` under `parent`; its attributes, or why not.
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: FileType,
        perm: u16,
    ) -> Result<FileAttr, Errno> {
        let mut t = self.tree.lock();
        let ino = t.next;
        let dir = t.nodes.get_mut(&parent.0).ok_or(Errno::ENOENT)?;
        if dir.attr.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        if dir.children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        dir.children.insert(name.to_owned(), ino);
        let now = SystemTime::now();
        (dir.attr.mtime, dir.attr.ctime) = (now, now);
        if kind == FileType::Directory {
            dir.attr.nlink += 1;
        }
        t.next += 1;
        let attr = new_attr(ino, kind, perm, req.uid(), req.gid());
        t.nodes.insert(ino, Node::new(attr, parent.0));
        Ok(attr)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut t = self.tree.lock();
        let p = t.nodes.get(&parent.0).ok_or(Errno::ENOENT)?;
        let ino = *p.children.get(name).ok_or(Errno::ENOENT)?;
        let node = &t.nodes[&ino];
        match (dir, node.attr.kind == FileType::Directory) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if !node.children.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        t.nodes.remove(&ino);
        let p = t.nodes.get_mut(&parent.0).expect("checked above");
        p.children.remove(name);
        let now = SystemTime::now();
        (p.attr.mtime, p.attr.ctime) = (now, now);
        if dir {
            p.attr.nlink -= 1;
        }
        Ok(())
    }
}

impl Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.add_capabilities(
            fuser::InitFlags::FUSE_PARALLEL_DIROPS | fuser::InitFlags::FUSE_WRITEBACK_CACHE,
        );
        if config
            .add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING)
            .is_ok()
        {
            eprintln!("memfs: serving requests over FUSE rings");
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = self.tree.lock();
        let Some(dir) = t.nodes.get(&parent.0) else {
            return reply.error(Errno::ENOENT);
        };
        match dir.children.get(name) {
            Some(ino) => reply.entry(&TTL, &t.nodes[ino].attr, Generation(0)),
            // Kept by the kernel as long as a found name: nothing else changes this tree.
            None => reply.entry(
                &TTL,
                &FileAttr {
                    ino: INodeNo(0),
                    ..dir.attr
                },
                Generation(0),
            ),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree.lock().nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &n.attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = self.tree.lock();
        let Some(n) = t.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let time = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => SystemTime::now(),
        };
        if let Some(m) = mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        n.attr.uid = uid.unwrap_or(n.attr.uid);
        n.attr.gid = gid.unwrap_or(n.attr.gid);
        if let Some(s) = size {
            n.data.resize(s as usize, 0);
            n.attr.size = s;
        }
        n.attr.atime = atime.map_or(n.attr.atime, time);
        n.attr.mtime = mtime.map_or(n.attr.mtime, time);
        n.attr.ctime = SystemTime::now();
        reply.attr(&TTL, &n.attr);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        match self.make(req, parent, name, FileType::Directory, perm) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        match self.make(req, parent, name, FileType::RegularFile, perm) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let t = self.tree.lock();
        let Some(n) = t.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let start = (offset as usize).min(n.data.len());
        let end = start.saturating_add(size as usize).min(n.data.len());
        reply.data(&n.data[start..end]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut t = self.tree.lock();
        let Some(n) = t.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        n.attr.size = n.data.len() as u64;
        n.attr.blocks = n.attr.size.div_ceil(512);
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t = self.tree.lock();
        let Some(dir) = t.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let dots = [(ino.0, OsStr::new(".")), (dir.parent, OsStr::new(".."))];
        let entries = dots
            .into_iter()
            .chain(dir.children.iter().map(|(n, i)| (*i, n.as_os_str())));
        for (k, (i, name)) in entries.enumerate().skip(offset as usize) {
            let kind = t.nodes.get(&i).map_or(FileType::Directory, |n| n.attr.kind);
            if reply.add(INodeNo(i), k as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

fn main() -> std::io::Result<()> {
    let Some(mountpoint) = std::env::args_os().nth(1) else {
        eprintln!("usage: memfs MOUNTPOINT");
        std::process::exit(2);
    };
    let mut cfg = fuser::Config::default();
    cfg.n_threads = Some(4);
    cfg.acl = fuser::SessionACL::All;
    cfg.mount_options = vec![
        MountOption::FSName("memfs".into()),
        MountOption::DefaultPermissions,
    ];
    let session = fuser::spawn_mount(MemFs::new(), &mountpoint, &cfg)?;
    eprintln!("memfs: mounted on {}", mountpoint.to_string_lossy());
    session.join()
}
