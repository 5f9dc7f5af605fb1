//! Rules the client and the MDS must apply alike, written once.
//!
//! The client answers some metadata calls ahead of the MDS (a lookup from a lease, a create or
//! an unlink in a directory it holds alone). Each answer is right only if the client decides it
//! the way the MDS will: which names are valid, who may remove an entry, which inodes a change
//! touches. Those decisions live here, on plain data, and both sides call them.

use crate::md::{Creds, Inode, Mutation};
use crate::{Fid, FsErrorKind};

/// Longest name of a directory entry, in bytes.
pub const MAX_NAME: usize = 255;

/// Sticky bit of a directory's mode: only an entry's owner (or the directory's) removes it.
pub const S_ISVTX: u32 = 0o1000;

/// Why a name cannot be a directory entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0:?} is not a valid name here")]
    Reserved(String),
    #[error("a name is at most {MAX_NAME} bytes")]
    TooLong,
    #[error("a name cannot hold '/' or NUL")]
    Separator,
}

impl NameError {
    pub fn kind(&self) -> FsErrorKind {
        match self {
            NameError::TooLong => FsErrorKind::NameTooLong,
            NameError::Reserved(_) | NameError::Separator => FsErrorKind::Invalid,
        }
    }
}

/// Whether `name` may be a directory entry: not empty, `.` or `..`, at most [`MAX_NAME`]
/// bytes, without `/` or NUL.
pub fn check_name(name: &[u8]) -> Result<(), NameError> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(NameError::Reserved(String::from_utf8_lossy(name).into()));
    }
    if name.len() > MAX_NAME {
        return Err(NameError::TooLong);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(NameError::Separator);
    }
    Ok(())
}

/// Why an entry may not be removed or replaced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnlinkError {
    #[error("permission denied on {0}")]
    Denied(Fid),
    #[error("sticky directory: only the owner may remove this entry")]
    Sticky,
}

impl UnlinkError {
    pub fn kind(&self) -> FsErrorKind {
        match self {
            UnlinkError::Denied(_) => FsErrorKind::AccessDenied,
            UnlinkError::Sticky => FsErrorKind::NotPermitted,
        }
    }
}

/// Whether `who` may remove or replace the entry for `victim` in `dir`: write and search on the
/// directory and, in a sticky directory, owning the entry or the directory (root passes).
pub fn may_unlink(dir: &Inode, victim: &Inode, who: &Creds) -> Result<(), UnlinkError> {
    if !dir.permits(who, 3) {
        return Err(UnlinkError::Denied(dir.fid));
    }
    if dir.mode & S_ISVTX != 0 && who.uid != 0 && who.uid != victim.uid && who.uid != dir.uid {
        return Err(UnlinkError::Sticky);
    }
    Ok(())
}

/// What a change names, the facts both sides derive their caches and recalls from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touches<'a> {
    /// Inodes the change names by FID (a link's file, a setattr's inode, released files).
    pub inodes: Vec<Fid>,
    /// Directory entries the change creates, removes or replaces: (directory, name).
    pub entries: Vec<(Fid, &'a [u8])>,
    /// Whether what `entries` names now is changed too (an unlink's or a rename's victim), so
    /// that the inodes they hold count as touched.
    pub replaces: bool,
}

impl Mutation {
    /// The inodes and entries this change names.
    pub fn touches(&self) -> Touches<'_> {
        let fid = |f: &Fid| Touches {
            inodes: vec![*f],
            ..Touches::default()
        };
        match self {
            Mutation::Create { parent, name, .. }
            | Mutation::CreateAt { parent, name, .. }
            | Mutation::MkdirOn { parent, name, .. }
            | Mutation::MkdirStriped { parent, name, .. }
            | Mutation::LinkRemoteDir { parent, name, .. }
            | Mutation::HsmImport { parent, name, .. } => Touches {
                entries: vec![(*parent, name.as_slice())],
                ..Touches::default()
            },
            Mutation::MoveOut { moving } => Touches {
                entries: vec![(moving.parent, moving.name.as_slice())],
                ..Touches::default()
            },
            Mutation::MoveDone { parent, name } | Mutation::MoveAbort { parent, name } => Touches {
                entries: vec![(*parent, name.as_slice())],
                replaces: true,
                ..Touches::default()
            },
            Mutation::LinkIn { parent, name, .. } => Touches {
                entries: vec![(*parent, name.as_slice())],
                replaces: true,
                ..Touches::default()
            },
            Mutation::DropLink { fid: f }
            | Mutation::LinkDone { fid: f, .. }
            | Mutation::LinkAbort { fid: f, .. } => fid(f),
            Mutation::LinkOut { linking } => fid(&linking.fid),
            Mutation::PlaceOut { parent, placing } => Touches {
                entries: vec![(*parent, placing.name.as_slice())],
                ..Touches::default()
            },
            Mutation::PlaceDone { parent, name } | Mutation::PlaceAbort { parent, name } => {
                Touches {
                    entries: vec![(*parent, name.as_slice())],
                    replaces: true,
                    ..Touches::default()
                }
            }
            Mutation::RmdirRemote { fid: f }
            | Mutation::SetDirStripe { fid: f, .. }
            | Mutation::FreezeShard { fid: f, .. }
            | Mutation::RmdirShard { fid: f }
            | Mutation::Reparent { dir: f, .. } => fid(f),
            Mutation::Link { fid, parent, name } => Touches {
                inodes: vec![*fid],
                entries: vec![(*parent, name.as_slice())],
                replaces: false,
            },
            Mutation::Unlink { parent, name, .. } => Touches {
                inodes: vec![],
                entries: vec![(*parent, name.as_slice())],
                replaces: true,
            },
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ..
            } => Touches {
                inodes: vec![],
                entries: vec![
                    (*parent, name.as_slice()),
                    (*new_parent, new_name.as_slice()),
                ],
                replaces: true,
            },
            Mutation::Setattr { fid: f, .. }
            | Mutation::SetXattr { fid: f, .. }
            | Mutation::SetXattrIf { fid: f, .. }
            | Mutation::RemoveXattr { fid: f, .. }
            | Mutation::GrowSize { fid: f, .. }
            | Mutation::SetLayout { fid: f, .. }
            | Mutation::MirrorState { fid: f, .. }
            | Mutation::PlaceMirror { fid: f, .. }
            | Mutation::WriteMdt { fid: f, .. }
            | Mutation::HsmSet { fid: f, .. }
            | Mutation::HsmReimport { fid: f, .. } => fid(f),

            Mutation::Released { fids } => Touches {
                inodes: fids.clone(),
                ..Touches::default()
            },
            Mutation::CreateUnnamed { .. }
            | Mutation::Destroyed { .. }
            | Mutation::SkipInodes { .. }
            | Mutation::ReserveInodes { .. }
            | Mutation::MkdirForRemote { .. }
            | Mutation::MakeShard { .. }
            | Mutation::Dropped { .. }
            | Mutation::RenameLock { .. }
            | Mutation::HsmLinks { .. } => Touches::default(),
        }
    }

    /// Whether the change, asked with an open handle, counts that handle as an open (a create
    /// with `O_CREAT`). On any other change a handle counts nothing.
    pub fn counts_open(&self) -> bool {
        matches!(
            self,
            Mutation::Create { .. } | Mutation::CreateAt { .. } | Mutation::CreateUnnamed { .. }
        )
    }

    /// The inode whose handle, opened for writing, allows this change without the caller's
    /// permission now (the open was the check): a size or time change (`ftruncate` of a file
    /// created with mode 0), a growth, a write of the MDS's part, a mirror's placement or state.
    /// A setattr of mode, owner or a chosen atime is never allowed by a handle.
    pub fn allowed_by_handle(&self) -> Option<Fid> {
        match self {
            Mutation::GrowSize { fid, .. }
            | Mutation::WriteMdt { fid, .. }
            | Mutation::MirrorState { fid, .. }
            | Mutation::PlaceMirror { fid, .. } => Some(*fid),
            Mutation::Setattr { fid, attr } => (attr.mode.is_none()
                && attr.uid.is_none()
                && attr.gid.is_none()
                && (attr.times_now || attr.atime.is_none()))
            .then_some(*fid),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::md::{Kind, SetAttr, Time};

    #[test]
    fn names_the_mds_refuses_are_refused_here() {
        for bad in [
            &b""[..],
            b".",
            b"..",
            b"a/b",
            b"a\0b",
            &[b'x'; MAX_NAME + 1],
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            check_name(&[b'x'; 256]).unwrap_err().kind(),
            FsErrorKind::NameTooLong
        );
        assert!(check_name(&[b'x'; MAX_NAME]).is_ok());
        assert!(check_name(b"...").is_ok());
    }

    fn inode(oid: u32, uid: u32, mode: u32, kind: Kind) -> Inode {
        Inode {
            fid: Fid::new(1, oid, 0),
            kind,
            mode,
            uid,
            gid: uid,
            nlink: 1,
            size: 0,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            xattrs: Default::default(),
            layout: None,
            target: vec![],
        }
    }

    #[test]
    fn the_sticky_bit_keeps_others_entries() {
        let who = |uid| Creds {
            uid,
            gid: uid,
            groups: vec![],
        };
        let dir = inode(1, 10, 0o1777, Kind::Dir);
        let theirs = inode(2, 20, 0o644, Kind::File);
        let mine = inode(3, 30, 0o644, Kind::File);
        assert_eq!(
            may_unlink(&dir, &theirs, &who(30)),
            Err(UnlinkError::Sticky)
        );
        assert!(may_unlink(&dir, &mine, &who(30)).is_ok());
        assert!(
            may_unlink(&dir, &theirs, &who(10)).is_ok(),
            "the directory's owner"
        );
        assert!(may_unlink(&dir, &theirs, &who(0)).is_ok(), "root");
        let closed = inode(4, 10, 0o755, Kind::Dir);
        assert_eq!(
            may_unlink(&closed, &mine, &who(30)),
            Err(UnlinkError::Denied(closed.fid))
        );
    }

    #[test]
    fn only_size_and_time_changes_go_through_a_handle() {
        let fid = Fid::new(1, 9, 0);
        let size = Mutation::Setattr {
            fid,
            attr: SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
        };
        assert_eq!(size.allowed_by_handle(), Some(fid));
        let chmod = Mutation::Setattr {
            fid,
            attr: SetAttr {
                mode: Some(0o777),
                ..SetAttr::default()
            },
        };
        assert_eq!(chmod.allowed_by_handle(), None);
        let unlink = Mutation::Unlink {
            parent: fid,
            name: b"x".to_vec(),
            dir: false,
        };
        assert_eq!(unlink.allowed_by_handle(), None);
        assert!(unlink.touches().replaces);
        assert!(!unlink.counts_open());
    }
}
