//! The namespace's side of encryption at rest: a directory bound to a policy while empty, the
//! policy passed on to everything made below it (in `proto::md::new_inode`), and no inode
//! moved or linked across a policy's edge (fscrypt's EXDEV). The MDS never holds a key: it
//! keeps what the clients encrypted.

use proto::crypt::{Policy, MAX_STORED_NAME, POLICY_XATTR};

use super::*;

/// Whether `name` has the form of an encrypted directory's names (base64url of ciphertext).
pub(super) fn stored_name(name: &[u8]) -> bool {
    name.len() <= MAX_STORED_NAME && proto::crypt::is_stored_name(name)
}

impl Namespace {
    /// `name` may be an entry of directory `parent`: at most [`MAX_NAME`] bytes, or, in an
    /// encrypted directory, an encrypted name up to [`MAX_STORED_NAME`].
    ///
    /// A new name in an encrypted directory must have the form of an encrypted one: a client
    /// that did not know the directory's policy yet (set since by another) is told so, and
    /// encrypts it (no clear name is kept there by a client that follows the protocol).
    pub(super) fn check_name_in(&self, parent: Fid, name: &[u8]) -> Result<()> {
        check_name(name)?;
        let encrypted = self
            .inodes
            .get(&parent)
            .is_some_and(proto::crypt::is_encrypted);
        if encrypted && !stored_name(name) {
            return err(
                FsErrorKind::NoKey,
                format!("{parent} is encrypted: its names are encrypted by the client"),
            );
        }
        if name.len() > MAX_NAME && !encrypted {
            return err(
                FsErrorKind::NameTooLong,
                format!("a name is at most {MAX_NAME} bytes"),
            );
        }
        Ok(())
    }

    /// `inode` may be named in directory `parent`: both under the same policy, or neither
    /// encrypted (else its contents or names would be under another key than its
    /// directory's, or in clear in an encrypted tree).
    pub(super) fn same_policy(&self, inode: &Inode, parent: Fid) -> Result<()> {
        let p = self.inode(parent)?;
        if inode.xattrs.get(POLICY_XATTR) != p.xattrs.get(POLICY_XATTR) {
            return err(
                FsErrorKind::CrossDevice,
                "across the edge of an encrypted tree (another policy, or none)",
            );
        }
        Ok(())
    }

    /// Binds empty directory `fid` to the encryption policy `value`: by its owner or root, once
    /// (a policy is never changed or removed: the names and contents below are under it).
    pub(super) fn set_crypt_policy(
        &mut self,
        fid: Fid,
        value: Option<&Vec<u8>>,
        who: &Creds,
        now: Time,
    ) -> Result<Applied> {
        let Some(value) = value else {
            return err(
                FsErrorKind::NotPermitted,
                "an encryption policy is never removed",
            );
        };
        let entries = self.dir(fid)?;
        let i = self.inode(fid)?;
        if who.uid != 0 && who.uid != i.uid {
            return err(
                FsErrorKind::NotPermitted,
                format!("only {fid}'s owner or root sets its encryption policy"),
            );
        }
        if Policy::decode(value).is_none() {
            return err(FsErrorKind::Invalid, "not an encryption policy lode knows");
        }
        if let Some(have) = i.xattrs.get(POLICY_XATTR) {
            // Setting the same policy again is a no-op, as with fscrypt.
            if have == value {
                return Ok(Applied {
                    inode: Some(i.clone()),
                    removed: vec![],
                    reserved: None,
                });
            }
            return err(
                FsErrorKind::Exists,
                format!("{fid} is encrypted under another policy"),
            );
        }
        if fid == self.root() || !entries.is_empty() {
            return err(
                FsErrorKind::NotEmpty,
                format!("{fid} is not an empty directory: a policy is set on an empty one"),
            );
        }
        if self.is_remote(fid)
            || i.xattrs.contains_key(proto::dirstripe::LMV_XATTR)
            || i.xattrs.contains_key(proto::dirstripe::SHARD_XATTR)
        {
            return err(
                FsErrorKind::NotSupported,
                "an encrypted directory is an unstriped one of its own MDT",
            );
        }
        // Names imported from an S3 bucket would be in clear in it.
        let root = self.inode(self.root())?;
        if proto::hsm::Links::of_inode(root)
            .links
            .iter()
            .any(|l| self.is_within(fid, l.dir))
        {
            return err(
                FsErrorKind::NotSupported,
                format!("{fid} is in a directory linked to S3: its names are imported in clear"),
            );
        }
        let x = self.inodes.get_mut(&fid).expect("checked above");
        x.xattrs.insert(POLICY_XATTR.to_owned(), value.clone());
        x.ctime = now;
        Ok(Applied {
            inode: Some(x.clone()),
            removed: vec![],
            reserved: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk(ns: &mut Namespace, parent: Fid, name: &[u8], kind: Kind) -> Result<Inode> {
        let m = Mutation::Create {
            parent,
            name: name.to_vec(),
            kind,
            mode: 0o755,
            exclusive: true,
            target: vec![],
            layout: None,
        };
        let who = Creds {
            uid: 1000,
            gid: 1000,
            groups: vec![],
        };
        ns.apply(&m, &who, Time::default())
            .map(|a| a.inode.expect("made"))
    }

    #[test]
    fn a_tree_takes_a_policy_once_while_empty_passes_it_on_and_keeps_its_edge() {
        let mut ns = Namespace::default();
        let root = ns.root();
        ns.apply(
            &Mutation::Setattr {
                fid: root,
                attr: proto::md::SetAttr {
                    mode: Some(0o777),
                    ..Default::default()
                },
            },
            &Creds::root(),
            Time::default(),
        )
        .unwrap();
        let dir = mk(&mut ns, root, b"vault", Kind::Dir).unwrap().fid;
        let clear = mk(&mut ns, root, b"clear", Kind::Dir).unwrap().fid;
        mk(&mut ns, clear, b"f", Kind::File).unwrap();
        let p = Policy::new([1; 16], [2; 16]).encode();
        let set = |fid: Fid, value: Vec<u8>| Mutation::SetXattr {
            fid,
            name: POLICY_XATTR.into(),
            value,
        };
        let owner = Creds {
            uid: 1000,
            gid: 1000,
            groups: vec![],
        };
        let other = Creds {
            uid: 1001,
            gid: 1001,
            groups: vec![],
        };
        let kind = |r: Result<Applied>| r.err().map(|e| e.kind);
        assert_eq!(
            kind(ns.apply(&set(dir, p.clone()), &other, Time::default())),
            Some(FsErrorKind::NotPermitted)
        );
        assert_eq!(
            kind(ns.apply(&set(clear, p.clone()), &owner, Time::default())),
            Some(FsErrorKind::NotEmpty)
        );
        assert_eq!(
            kind(ns.apply(&set(dir, vec![1, 2, 3]), &owner, Time::default())),
            Some(FsErrorKind::Invalid)
        );
        ns.apply(&set(dir, p.clone()), &owner, Time::default())
            .unwrap();
        // Again the same: nothing changes; another, or a removal: refused.
        ns.apply(&set(dir, p.clone()), &owner, Time::default())
            .unwrap();
        let q = Policy::new([3; 16], [2; 16]).encode();
        assert_eq!(
            kind(ns.apply(&set(dir, q), &owner, Time::default())),
            Some(FsErrorKind::Exists)
        );
        let rm = Mutation::RemoveXattr {
            fid: dir,
            name: POLICY_XATTR.into(),
        };
        assert_eq!(
            kind(ns.apply(&rm, &Creds::root(), Time::default())),
            Some(FsErrorKind::NotPermitted)
        );
        // A clear name is refused; an encrypted one is taken, and its inode inherits.
        assert_eq!(
            mk(&mut ns, dir, b"weights", Kind::File)
                .err()
                .map(|e| e.kind),
            Some(FsErrorKind::NoKey)
        );
        let name = vec![b'Q'; 43];
        let sub = mk(&mut ns, dir, &name, Kind::Dir).unwrap();
        assert_eq!(sub.xattrs.get(POLICY_XATTR), Some(&p));
        let long = vec![b'x'; MAX_STORED_NAME];
        let deep = mk(&mut ns, sub.fid, &long, Kind::File).unwrap();
        assert_eq!(deep.xattrs.get(POLICY_XATTR), Some(&p));
        // Across the edge: EXDEV both ways.
        let mv = |parent, name: &[u8], new_parent, new_name: &[u8]| Mutation::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags: Default::default(),
        };
        assert_eq!(
            kind(ns.apply(&mv(clear, b"f", dir, &[b'R'; 43]), &owner, Time::default())),
            Some(FsErrorKind::CrossDevice)
        );
        assert_eq!(
            kind(ns.apply(&mv(dir, &name, clear, b"out"), &owner, Time::default())),
            Some(FsErrorKind::CrossDevice)
        );
        // Within the tree: fine.
        ns.apply(
            &mv(sub.fid, &long, dir, &[b'S'; 64]),
            &owner,
            Time::default(),
        )
        .unwrap();
        assert!(ns.check().is_empty(), "{:?}", ns.check());
    }
}
