//! The session's side of encryption at rest ([`crate::crypt`]): names of encrypted
//! directories encrypted on their way to the MDS and decrypted on their way back, symlink
//! targets likewise, and the contents cipher of a file opened. Callers always speak in clear
//! names; the lease cache, the queue of changes answered ahead and the MDS hold the encrypted
//! ones.
//!
//! Without the key, an encrypted directory lists its names as kept (base64url), and those
//! names can be looked up, removed and renamed within it (as fscrypt's no-key names); a new
//! name, a symlink's target and a file's contents are `ENOKEY`.

use proto::crypt::Policy;
use proto::md::{DirEntry, Inode, Kind, Mutation};
use proto::rules::MAX_NAME;
use proto::{Fid, FsErrorKind};

use crate::client::{Client, ROOT};
use crate::crypt::{Contents, CryptError, MasterKey};
use crate::error::{ClientError, Result};

fn crypt_error(e: CryptError) -> ClientError {
    let kind = match e {
        CryptError::KeyLength(_) | CryptError::KeyFile { .. } => FsErrorKind::Invalid,
        _ => FsErrorKind::Io,
    };
    ClientError::fs(kind, e.to_string())
}

fn no_key(p: &Policy) -> ClientError {
    ClientError::fs(
        FsErrorKind::NoKey,
        format!(
            "encrypted under key {}, which is not unlocked here (lode crypt unlock)",
            p.key_hex()
        ),
    )
}

impl Client {
    /// Forgets what this client knew of the policies of `dirs` (asked again when next needed).
    pub(crate) fn forget_policies(&self, dirs: &[Fid]) {
        for d in dirs {
            self.inner.crypt.forget(*d);
        }
    }

    /// Gives this client the master key `key` (besides those in the user's keyring); its
    /// identifier.
    pub fn crypt_add_key(&self, key: MasterKey) -> [u8; proto::crypt::KEY_ID_LEN] {
        self.inner.crypt.add(key)
    }

    /// Takes back a key given with [`Client::crypt_add_key`] (dropped, so zeroized, once no
    /// open file holds it); whether this client had it.
    pub fn crypt_remove_key(&self, id: &[u8; proto::crypt::KEY_ID_LEN]) -> bool {
        self.inner.crypt.remove(id)
    }

    /// Whether this client holds the key of `policy`.
    pub fn crypt_unlocked(&self, policy: &Policy) -> Result<bool> {
        Ok(self.key_of(policy)?.is_some())
    }

    fn key_of(&self, policy: &Policy) -> Result<Option<std::sync::Arc<MasterKey>>> {
        self.inner.crypt.key_for(policy).map_err(crypt_error)
    }

    /// Remembers `inode`'s policy when it is a directory.
    pub(crate) fn learn_policy(&self, inode: &Inode) {
        self.inner.crypt.learn(inode);
    }

    /// The policy of directory `dir`, if known without asking (the root never has one).
    pub(crate) fn known_policy(&self, dir: Fid) -> Option<Option<Policy>> {
        if dir == ROOT {
            return Some(None);
        }
        self.inner.crypt.known(dir)
    }

    /// The policy of directory `dir`, asked of the MDS when not known.
    pub(crate) async fn dir_policy(&self, dir: Fid) -> Result<Option<Policy>> {
        if let Some(p) = self.known_policy(dir) {
            return Ok(p);
        }
        let i = self.getattr(dir).await?;
        self.learn_policy(&i);
        Ok(Policy::of_inode(&i))
    }

    /// `name` of directory `dir` under `policy` as the MDS keeps it.
    fn encode_name(&self, policy: &Policy, dir: Fid, name: &[u8]) -> Result<Vec<u8>> {
        if name == b"." || name == b".." {
            return Ok(name.to_vec());
        }
        match self.key_of(policy)? {
            Some(k) => {
                if name.len() > MAX_NAME {
                    return Err(ClientError::fs(
                        FsErrorKind::NameTooLong,
                        format!("a name is at most {MAX_NAME} bytes"),
                    ));
                }
                Ok(k.names(policy, dir).map_err(crypt_error)?.encrypt(name))
            }
            None if crate::crypt::stored_form(name) => Ok(name.to_vec()),
            // A name no entry can have there (as fscrypt answers a name that is not a no-key
            // one); a new name is refused earlier, for the key.
            None => Err(ClientError::fs(
                FsErrorKind::NotFound,
                format!(
                    "{:?}: the directory's names are encrypted under key {}, not unlocked here",
                    String::from_utf8_lossy(name),
                    policy.key_hex()
                ),
            )),
        }
    }

    /// A new `name` of directory `dir` under `policy` as the MDS is to keep it, if this
    /// client holds the key (a new name needs it).
    pub(crate) fn new_name_under(&self, policy: &Policy, dir: Fid, name: &[u8]) -> Option<Vec<u8>> {
        self.key_of(policy).ok().flatten()?;
        self.encode_name(policy, dir, name).ok()
    }

    /// `name` of directory `dir` as the MDS keeps it: encrypted in an encrypted directory.
    pub(crate) async fn stored_name(&self, dir: Fid, name: &[u8]) -> Result<Vec<u8>> {
        match self.dir_policy(dir).await? {
            None => Ok(name.to_vec()),
            Some(p) => self.encode_name(&p, dir, name),
        }
    }

    /// As [`Client::stored_name`] when `dir`'s policy is known without asking; `None`
    /// otherwise.
    pub(crate) fn stored_name_known(&self, dir: Fid, name: &[u8]) -> Option<Result<Vec<u8>>> {
        match self.known_policy(dir)? {
            None => Some(Ok(name.to_vec())),
            Some(p) => Some(self.encode_name(&p, dir, name)),
        }
    }

    /// The entries of directory `dir` with their names in clear (as kept, without the key).
    pub(crate) async fn shown_entries(&self, dir: Fid, entries: &mut [DirEntry]) -> Result<()> {
        let Some(p) = self.dir_policy(dir).await? else {
            return Ok(());
        };
        let Some(k) = self.key_of(&p)? else {
            return Ok(());
        };
        let names = k.names(&p, dir).map_err(crypt_error)?;
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            if let Some(n) = names.decrypt(&e.name) {
                e.name = n;
            }
        }
        Ok(())
    }

    /// `m` with its names (and a new symlink's target) as the MDS keeps them.
    pub(crate) async fn stored_mutation(&self, m: Mutation) -> Result<Mutation> {
        Ok(match m {
            Mutation::Create {
                parent,
                name,
                kind,
                mode,
                exclusive,
                target,
                layout,
            } => {
                let (name, target) = self.stored_entry(parent, &name, kind, target).await?;
                Mutation::Create {
                    parent,
                    name,
                    kind,
                    mode,
                    exclusive,
                    target,
                    layout,
                }
            }
            Mutation::CreateAt {
                fid,
                parent,
                name,
                kind,
                mode,
                target,
                layout,
            } => {
                let (name, target) = self.stored_entry(parent, &name, kind, target).await?;
                Mutation::CreateAt {
                    fid,
                    parent,
                    name,
                    kind,
                    mode,
                    target,
                    layout,
                }
            }
            Mutation::Link { fid, parent, name } => Mutation::Link {
                fid,
                parent,
                name: self.stored_name(parent, &name).await?,
            },
            Mutation::Unlink { parent, name, dir } => Mutation::Unlink {
                parent,
                name: self.stored_name(parent, &name).await?,
                dir,
            },
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => Mutation::Rename {
                parent,
                name: self.stored_name(parent, &name).await?,
                new_parent,
                new_name: self.stored_name(new_parent, &new_name).await?,
                flags,
            },
            Mutation::MkdirOn {
                parent,
                name,
                mode,
                mdt,
            } => Mutation::MkdirOn {
                parent,
                name: self.stored_name(parent, &name).await?,
                mode,
                mdt,
            },
            Mutation::MkdirStriped {
                parent,
                name,
                mode,
                count,
                offset,
                hash,
            } => Mutation::MkdirStriped {
                parent,
                name: self.stored_name(parent, &name).await?,
                mode,
                count,
                offset,
                hash,
            },
            other => other,
        })
    }

    /// A new entry's name and (for a symlink) target as kept.
    async fn stored_entry(
        &self,
        parent: Fid,
        name: &[u8],
        kind: Kind,
        target: Vec<u8>,
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        let Some(p) = self.dir_policy(parent).await? else {
            return Ok((name.to_vec(), target));
        };
        // A new name needs the key (a kept name alone would be one no key decrypts).
        let Some(k) = self.key_of(&p)? else {
            return Err(no_key(&p));
        };
        let name = self.encode_name(&p, parent, name)?;
        let target = if kind == Kind::Symlink {
            k.targets(&p)
                .and_then(|t| t.encrypt(&target))
                .map_err(crypt_error)?
        } else {
            target
        };
        Ok((name, target))
    }

    /// The target of symlink `inode`, in clear.
    pub fn link_target(&self, inode: &Inode) -> Result<Vec<u8>> {
        let Some(p) = Policy::of_inode(inode) else {
            return Ok(inode.target.clone());
        };
        let Some(k) = self.key_of(&p)? else {
            return Err(no_key(&p));
        };
        k.targets(&p)
            .map_err(crypt_error)?
            .decrypt(&inode.target)
            .ok_or_else(|| {
                ClientError::fs(
                    FsErrorKind::NoKey,
                    format!(
                        "{}: the symlink's target does not decrypt under its key",
                        inode.fid
                    ),
                )
            })
    }

    /// The contents cipher of file `inode`: `None` for a file in clear.
    pub(crate) fn contents_of(&self, inode: &Inode) -> Result<Option<Contents>> {
        let Some(p) = Policy::of_inode(inode) else {
            return Ok(None);
        };
        let Some(k) = self.key_of(&p)? else {
            return Err(no_key(&p));
        };
        Ok(Some(k.contents(&p, inode.fid).map_err(crypt_error)?))
    }
}

impl Client {
    /// Binds the empty directory `path` to `key` (`lode crypt set`): everything made below it
    /// is encrypted under it. Setting the same key again changes nothing; another is refused.
    pub async fn crypt_set(&self, path: &str, key: &MasterKey) -> Result<Policy> {
        let dir = self.resolve(path, true).await?;
        if dir.kind != Kind::Dir {
            return Err(ClientError::fs(
                FsErrorKind::NotDir,
                format!("{path} is not a directory"),
            ));
        }
        if let Some(p) = Policy::of_inode(&dir) {
            if key.unlocks(&p) {
                return Ok(p);
            }
            return Err(ClientError::fs(
                FsErrorKind::Exists,
                format!("{path} is encrypted under another key ({})", p.key_hex()),
            ));
        }
        let mut nonce = [0u8; 16];
        aws_lc_rs::rand::fill(&mut nonce)
            .map_err(|_| ClientError::fs(FsErrorKind::Io, "no random bytes"))?;
        let policy = Policy::new(key.id(), nonce);
        let m = Mutation::SetXattrIf {
            fid: dir.fid,
            name: proto::crypt::POLICY_XATTR.to_string(),
            value: policy.encode(),
            replace: false,
        };
        let done = self.reint(m).await?;
        if let Some(i) = &done {
            self.learn_policy(i);
        }
        Ok(policy)
    }

    /// The policy of `path`, if it is encrypted.
    pub async fn crypt_policy(&self, path: &str) -> Result<Option<Policy>> {
        let i = self.resolve(path, true).await?;
        self.learn_policy(&i);
        Ok(Policy::of_inode(&i))
    }
}
