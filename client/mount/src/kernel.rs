//! How lode looks to the kernel: inode numbers from FIDs and back, times, file types and
//! attributes, errno from the library's typed errors (the mount is a POSIX edge), and the
//! caller's groups.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime};

use client::{ClientError, ROOT};
use fuser::{Errno, FileAttr, FileType, INodeNo};
use proto::md::{Inode, Kind, Time};
use proto::{Fid, FsErrorKind};

/// How long the kernel may trust attributes and entries it was given.
pub(crate) const TTL: Duration = Duration::from_secs(1);
/// How long it may trust those the client holds a lease on: until the lease is dropped, when
/// the mount drops the kernel's copy.
pub(crate) const LEASED_TTL: Duration = Duration::from_secs(3600);

/// The inode number of `fid`: its MDT above bit 32, its object id below, plus one (1 is the
/// root). MDT0's are the object id plus one, as before there were several MDTs.
pub(crate) fn ino_of(fid: Fid) -> INodeNo {
    if fid == ROOT {
        return INodeNo(1);
    }
    let mdt = proto::fid::mdt_of(fid).unwrap_or(0);
    INodeNo(((u64::from(mdt) << 32) | u64::from(fid.oid)) + 1)
}

pub(crate) fn fid_of(ino: INodeNo) -> Fid {
    if ino.0 == 1 {
        return ROOT;
    }
    let n = ino.0.wrapping_sub(1);
    let mdt = (n >> 32) as u32;
    Fid::new(proto::fid::inode_seq(mdt), n as u32, 0)
}

pub(crate) fn time(t: Time) -> SystemTime {
    t.to_system_time()
}

pub(crate) fn from_time(t: SystemTime) -> Time {
    Time::from(t)
}

pub(crate) fn kind(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev(_) => FileType::CharDevice,
        Kind::BlockDev(_) => FileType::BlockDevice,
    }
}

/// The attributes of a negative entry: inode 0 tells the kernel the name is absent, for the
/// entry's timeout.
pub(crate) fn absent() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

pub(crate) fn attr(i: &Inode, size: u64) -> FileAttr {
    FileAttr {
        ino: ino_of(i.fid),
        size,
        blocks: size.div_ceil(512),
        atime: time(i.atime),
        mtime: time(i.mtime),
        ctime: time(i.ctime),
        crtime: time(i.ctime),
        kind: kind(i.kind),
        perm: (i.mode & 0o7777) as u16,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.kind.rdev() as u32,
        blksize: 1 << 20,
        flags: 0,
    }
}

pub(crate) fn errno(e: &ClientError) -> Errno {
    let n = e.errno();
    if n == libc::EIO {
        // Not the caller's mistake: the operator wants to know.
        tracing::warn!(error = %e, errno = n, "an operation failed");
    } else if n == libc::ESTALE {
        // A file removed since the kernel last asked: the kernel drops its inode and looks the
        // name up again. Under the write-back cache it is every unlinked file's last
        // attributes, written back as its inode goes.
        tracing::debug!(error = %e, errno = n, "an operation on a removed file");
    }
    Errno::from_i32(n)
}

/// The supplementary groups of the calling process.
pub(crate) fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return vec![];
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn name(n: &OsStr) -> Vec<u8> {
    n.as_bytes().to_vec()
}

pub(crate) fn created(i: Option<Inode>) -> Result<Inode, ClientError> {
    i.ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))
}
