//! The namespace's side of encryption at rest: a directory bound to a policy while empty, the
//! policy passed on to everything made below it (in `proto::md::new_inode`), and no inode
//! moved or linked across a policy's edge (fscrypt's EXDEV). The MDS never holds a key: it
//! keeps what the clients encrypted.

use proto::crypt::{Policy, MAX_STORED_NAME, POLICY_XATTR};

use super::*;

/// Whether `name` has the form of an encrypted directory's names (base64url of ciphertext),
/// within their length.
pub(super) fn stored_name(name: &[u8]) -> bool {
    name.len() <= MAX_STORED_NAME
        && name
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
}

impl Namespace {
    /// `name` may be an entry of directory `parent`: at most [`MAX_NAME`] bytes, or, in an
    /// encrypted directory, an encrypted name up to [`MAX_STORED_NAME`].
    pub(super) fn check_name_in(&self, parent: Fid, name: &[u8]) -> Result<()> {
        check_name(name)?;
        if name.len() > MAX_NAME
            && !self
                .inodes
                .get(&parent)
                .is_some_and(proto::crypt::is_encrypted)
        {
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
