//! HSM through the MDS: data repository links, a file's state, archive, release and restore
//! requests, and the copytool's side of the queue. What moves the bytes to and from the
//! object store is the copytool (`lode-copytool`); the MDS decides every state.

use proto::hsm::*;
use proto::md::Inode;
use proto::{Fid, FsErrorKind};

use crate::client::Client;
use crate::error::{ClientError, Result};

/// How a restore stands for a reader.
#[derive(Clone, Debug)]
pub struct Restoring {
    /// The file is whole in lode again.
    pub done: bool,
    /// Bytes up to here are readable from mirror 0 of `inode`'s layout.
    pub landed: u64,
    pub inode: Inode,
}

impl Client {
    /// One HSM request to the MDS of `fid` (MDT0's for the filesystem's links).
    pub async fn hsm_request(&self, fid: Fid, request: HsmRequest) -> Result<HsmReply> {
        let there = self.at(fid).await?;
        let req = MdsHsm {
            creds: self.creds().clone(),
            request,
        };
        let peer = there.inner.mds.clone();
        there.rpc_raw(&peer, &req, None).await
    }

    async fn hsm_root(&self, request: HsmRequest) -> Result<HsmReply> {
        self.hsm_request(proto::fid::ROOT, request).await
    }

    /// Links the directory `path` to `url` (`s3://BUCKET[/PREFIX]`); administrators only.
    pub async fn hsm_link(
        &self,
        path: &str,
        url: &str,
        endpoint: Option<String>,
        region: Option<String>,
        import: Policy,
        export: Policy,
    ) -> Result<Link> {
        let (bucket, prefix) =
            parse_url(url).map_err(|e| ClientError::fs(FsErrorKind::Invalid, e))?;
        let link = Link {
            id: 0,
            dir: proto::fid::ROOT,
            path: path.to_string(),
            bucket,
            prefix,
            endpoint,
            region,
            import,
            export,
            importing: false,
        };
        match self.hsm_root(HsmRequest::Link(link)).await? {
            HsmReply::Link(l) => Ok(l),
            other => Err(unexpected(other)),
        }
    }

    /// The filesystem's links.
    pub async fn hsm_links(&self) -> Result<Vec<Link>> {
        match self.hsm_root(HsmRequest::Links).await? {
            HsmReply::Links(l) => Ok(l),
            other => Err(unexpected(other)),
        }
    }

    /// Removes the link of the directory `path`.
    pub async fn hsm_unlink(&self, path: &str) -> Result<()> {
        self.hsm_root(HsmRequest::Unlink {
            path: path.to_string(),
        })
        .await
        .map(|_| ())
    }

    /// Queues an import of the link of `path` again.
    pub async fn hsm_import_again(&self, path: &str) -> Result<()> {
        self.hsm_root(HsmRequest::ImportAgain {
            path: path.to_string(),
        })
        .await
        .map(|_| ())
    }

    /// What the MDS has queued and under way.
    pub async fn hsm_status(&self) -> Result<HsmReply> {
        self.hsm_root(HsmRequest::Status).await
    }

    /// `fid`'s HSM state, if it has one.
    pub async fn hsm_state(&self, fid: Fid) -> Result<Option<State>> {
        match self.hsm_request(fid, HsmRequest::State { fid }).await? {
            HsmReply::State(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Queues an archive of the file at `path`.
    pub async fn hsm_archive(&self, path: &str) -> Result<State> {
        let fid = self.resolve(path, true).await?.fid;
        let request = HsmRequest::Archive {
            fid,
            path: path.to_string(),
        };
        match self.hsm_request(fid, request).await? {
            HsmReply::State(Some(s)) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Frees the storage servers' space of the archived file at `path`.
    pub async fn hsm_release(&self, path: &str) -> Result<State> {
        let fid = self.resolve(path, true).await?.fid;
        match self.hsm_request(fid, HsmRequest::Release { fid }).await? {
            HsmReply::State(Some(s)) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// One round of a restore of `fid` for a reader up to `end`: started if the file is
    /// released, answered once those bytes landed or after a while.
    pub async fn hsm_restore_step(&self, fid: Fid, end: u64) -> Result<Restoring> {
        match self
            .hsm_request(fid, HsmRequest::Restore { fid, end })
            .await?
        {
            HsmReply::Restoring {
                done,
                landed,
                inode,
            } => Ok(Restoring {
                done,
                landed,
                inode,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Restores `fid` whole, calling `progress(landed, size)` as its bytes land; the file's
    /// attributes after.
    pub async fn hsm_restore(&self, fid: Fid, mut progress: impl FnMut(u64, u64)) -> Result<Inode> {
        loop {
            let r = self.hsm_restore_step(fid, u64::MAX).await?;
            progress(r.landed, r.inode.size);
            if r.done {
                return Ok(r.inode);
            }
        }
    }

    /// A copytool's: up to `max` actions, waiting a while for one.
    pub async fn hsm_take(&self, copytool: u128, max: u32) -> Result<Vec<Work>> {
        match self.hsm_root(HsmRequest::Take { copytool, max }).await? {
            HsmReply::Work(w) => Ok(w),
            other => Err(unexpected(other)),
        }
    }

    /// A copytool's: an import to carry out, if one is queued.
    pub async fn hsm_take_import(&self, copytool: u128) -> Result<Option<ImportWork>> {
        match self.hsm_root(HsmRequest::TakeImport { copytool }).await? {
            HsmReply::Import(w) => Ok(w),
            other => Err(unexpected(other)),
        }
    }

    /// A copytool's: names objects found under `link` in directory `parent`; (made,
    /// skipped).
    pub async fn hsm_import(
        &self,
        link: u32,
        parent: Fid,
        entries: Vec<Imported>,
    ) -> Result<(u32, u32)> {
        let request = HsmRequest::Import {
            link,
            parent,
            entries,
        };
        match self.hsm_request(parent, request).await? {
            HsmReply::Imported { made, skipped } => Ok((made, skipped)),
            other => Err(unexpected(other)),
        }
    }

    /// A copytool's: a restore's bytes up to `landed` are in place.
    pub async fn hsm_progress(&self, copytool: u128, w: &Work, landed: u64) -> Result<()> {
        let request = HsmRequest::Progress {
            copytool,
            id: w.id,
            landed,
        };
        self.hsm_request(w.fid, request).await.map(|_| ())
    }

    /// A copytool's: action `w` ended.
    pub async fn hsm_done(
        &self,
        copytool: u128,
        w: &Work,
        result: std::result::Result<Finished, Failure>,
    ) -> Result<()> {
        let request = HsmRequest::Done {
            copytool,
            id: w.id,
            result,
        };
        self.hsm_request(w.fid, request).await.map(|_| ())
    }

    /// A copytool's: an import ended.
    pub async fn hsm_import_done(
        &self,
        copytool: u128,
        link: u32,
        result: std::result::Result<u64, String>,
    ) -> Result<()> {
        let request = HsmRequest::ImportDone {
            copytool,
            link,
            result,
        };
        self.hsm_root(request).await.map(|_| ())
    }
}

fn unexpected(r: HsmReply) -> ClientError {
    ClientError::fs(
        FsErrorKind::Io,
        format!("the MDS answered an HSM request with {r:?}"),
    )
}
