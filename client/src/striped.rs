//! Striped directories, as a client sees them ([`proto::dirstripe`]): a name in a striped
//! directory is looked up, made, removed and renamed in the shard its hash places it in, on
//! that shard's MDT, and a listing reads every shard in turn.
//!
//! A directory's layout is learnt from its attributes (the master's [`LMV_XATTR`]) as they
//! pass through the library, and kept for the life of the client: a layout never changes once
//! made (a directory removed and made again under the same name has a new FID). A request
//! routed without it (a directory met by FID alone) is refused by the master's MDS with
//! [`FsErrorKind::WrongShard`]; the library reads the layout then and goes again. While the
//! directory's shards are being made or removed, it waits.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use proto::dirstripe::{DirDefault, DirStripe, StripeState, DEFAULT_XATTR, LMV_XATTR};
use proto::md::{Inode, MdsGetattr, Mutation};
use proto::{Fid, FsErrorKind};

use crate::client::Client;
use crate::error::{ClientError, Result};

impl Client {
    /// Keeps the layout of `inode` when it is a striped directory in use.
    pub(crate) fn learn_stripe(&self, inode: &Inode) {
        self.learn_policy(inode);
        let Some(v) = inode.xattrs.get(LMV_XATTR) else {
            return;
        };
        match DirStripe::decode(v) {
            Some(s) if s.state == StripeState::Ready => {
                self.inner.stripes.lock().insert(inode.fid, Arc::new(s));
            }
            _ => {
                self.inner.stripes.lock().remove(&inode.fid);
            }
        }
    }

    /// The layout of `dir` when this client knows it striped.
    pub(crate) fn known_stripe(&self, dir: Fid) -> Option<Arc<DirStripe>> {
        let s = self.inner.stripes.lock();
        if s.is_empty() {
            return None;
        }
        s.get(&dir).cloned()
    }

    /// Where `name` of `dir` lives: its shard, when `dir` is known striped; `dir` otherwise.
    pub(crate) fn shard_for(&self, dir: Fid, name: &[u8]) -> Fid {
        if name == b"." || name == b".." {
            return dir;
        }
        self.known_stripe(dir)
            .and_then(|s| s.shard_for(name))
            .unwrap_or(dir)
    }

    /// `m` with each directory it names replaced by the shard its name lives in.
    pub(crate) fn route(&self, m: Mutation) -> Mutation {
        if self.inner.stripes.lock().is_empty() {
            return m;
        }
        match m {
            Mutation::Create {
                parent,
                name,
                kind,
                mode,
                exclusive,
                target,
                layout,
            } => Mutation::Create {
                parent: self.shard_for(parent, &name),
                name,
                kind,
                mode,
                exclusive,
                target,
                layout,
            },
            Mutation::CreateAt {
                fid,
                parent,
                name,
                kind,
                mode,
                target,
                layout,
            } => Mutation::CreateAt {
                fid,
                parent: self.shard_for(parent, &name),
                name,
                kind,
                mode,
                target,
                layout,
            },
            Mutation::Unlink { parent, name, dir } => Mutation::Unlink {
                parent: self.shard_for(parent, &name),
                name,
                dir,
            },
            Mutation::Link { fid, parent, name } => Mutation::Link {
                fid,
                parent: self.shard_for(parent, &name),
                name,
            },
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => Mutation::Rename {
                parent: self.shard_for(parent, &name),
                name,
                new_parent: self.shard_for(new_parent, &new_name),
                new_name,
                flags,
            },
            Mutation::MkdirOn {
                parent,
                name,
                mode,
                mdt,
            } => Mutation::MkdirOn {
                parent: self.shard_for(parent, &name),
                name,
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
                parent: self.shard_for(parent, &name),
                name,
                mode,
                count,
                offset,
                hash,
            },
            // A file with no name takes its group from a directory: any shard's is the
            // master's.
            Mutation::CreateUnnamed {
                parent,
                mode,
                layout,
            } => Mutation::CreateUnnamed {
                parent: self
                    .known_stripe(parent)
                    .and_then(|s| s.shards.first().copied())
                    .unwrap_or(parent),
                mode,
                layout,
            },
            other => other,
        }
    }

    /// The directories `m` names (before routing), whose layouts are read again when the MDS
    /// says the change went to the wrong shard.
    pub(crate) fn dirs_of(m: &Mutation) -> Vec<Fid> {
        match m {
            Mutation::Create { parent, .. }
            | Mutation::CreateAt { parent, .. }
            | Mutation::CreateUnnamed { parent, .. }
            | Mutation::Unlink { parent, .. }
            | Mutation::Link { parent, .. }
            | Mutation::MkdirOn { parent, .. }
            | Mutation::MkdirStriped { parent, .. } => vec![*parent],
            Mutation::Rename {
                parent, new_parent, ..
            } => vec![*parent, *new_parent],
            _ => vec![],
        }
    }

    /// Reads `dir`'s layout again from its MDS (after a refusal for the wrong shard), waiting
    /// while its shards are being made or removed. A directory found not striped is
    /// forgotten as such; one whose shards are gone is not found.
    pub(crate) async fn reread_stripe(&self, dir: Fid) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            let r = MdsGetattr {
                fid: dir,
                creds: self.creds().clone(),
                lease: None,
            };
            let a = self.rpc(&self.mds_for(dir).await?, &r).await?;
            let stripe = a
                .inode
                .xattrs
                .get(LMV_XATTR)
                .and_then(|v| DirStripe::decode(v));
            match stripe.as_ref().map(|s| s.state) {
                None | Some(StripeState::Ready) => {
                    self.learn_stripe(&a.inode);
                    return Ok(());
                }
                Some(StripeState::Emptied) => {
                    self.inner.stripes.lock().remove(&dir);
                    return Err(ClientError::fs(
                        FsErrorKind::NotFound,
                        format!("{dir} is being removed"),
                    ));
                }
                Some(StripeState::Building) | Some(StripeState::Removing) => {}
            }
            if start.elapsed() > self.inner.cfg.retry_for {
                return Err(ClientError::fs(
                    FsErrorKind::WouldBlock,
                    format!("{dir}: its shards are still being made or removed"),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// The layout of directory `dir`, read from its MDS (`None`: not striped).
    pub async fn dir_stripe(&self, dir: Fid) -> Result<Option<DirStripe>> {
        let r = MdsGetattr {
            fid: dir,
            creds: self.creds().clone(),
            lease: None,
        };
        let a = self.rpc(&self.mds_for(dir).await?, &r).await?;
        self.learn_stripe(&a.inode);
        Ok(a.inode
            .xattrs
            .get(LMV_XATTR)
            .and_then(|v| DirStripe::decode(v)))
    }

    /// The default layout of the new subdirectories of directory `path`, when it has one
    /// (`lfs getdirstripe -D`).
    pub async fn dir_default(&self, path: &str) -> Result<Option<DirDefault>> {
        let dir = self.stat(path).await?;
        if dir.kind != proto::md::Kind::Dir {
            return Err(ClientError::fs(
                FsErrorKind::NotDir,
                format!("{path} is not a directory"),
            ));
        }
        let r = MdsGetattr {
            fid: dir.fid,
            creds: self.creds().clone(),
            lease: None,
        };
        let a = self.rpc(&self.mds_for(dir.fid).await?, &r).await?;
        Ok(proto::dirstripe::default_of_inode(&a.inode))
    }

    /// Sets (or with `None` removes) the default layout of the new subdirectories of
    /// directory `path` (`lfs setdirstripe -D`, `-d`): the directory's owner or root.
    pub async fn set_dir_default(&self, path: &str, default: Option<DirDefault>) -> Result<()> {
        if let Some(why) = default.as_ref().and_then(DirDefault::invalid) {
            return Err(ClientError::fs(FsErrorKind::Invalid, why));
        }
        let dir = self.stat(path).await?;
        let name = DEFAULT_XATTR.to_string();
        let m = match default {
            Some(d) => Mutation::SetXattr {
                fid: dir.fid,
                name,
                value: d.encode(),
            },
            None => Mutation::RemoveXattr { fid: dir.fid, name },
        };
        self.reint(m).await.map(|_| ())
    }

    /// Makes directory `path` striped over `count` MDTs, shard 0 on MDT `offset` (the
    /// parent's when `None`), names placed by `hash` (`lfs setdirstripe`).
    pub async fn mkdir_striped(
        &self,
        path: &str,
        mode: u32,
        count: u32,
        offset: Option<u32>,
        hash: proto::dirstripe::HashType,
    ) -> Result<Inode> {
        let (parent, name) = self.parent_of(path).await?;
        let m = Mutation::MkdirStriped {
            parent: parent.fid,
            name: name.to_vec(),
            mode,
            count,
            offset,
            hash: hash.code(),
        };
        let made = self
            .reint(m)
            .await?
            .ok_or_else(|| ClientError::fs(FsErrorKind::Io, "no inode in the reply"))?;
        if proto::dirstripe::of_inode(&made).is_some_and(|s| s.state != StripeState::Ready) {
            // Made, its shards not yet (an MDT did not answer): they follow.
            self.reread_stripe(made.fid).await?;
        }
        self.learn_stripe(&made);
        Ok(made)
    }
}
