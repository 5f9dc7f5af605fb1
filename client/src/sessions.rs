//! A client's sessions, one per MDT it meets (Lustre's one MDC import per MDT): MDT0's,
//! which the client connects to, and another MDT's, opened the first time a FID of that MDT
//! comes up. Every call about a FID goes through its MDT's session, whose leases, changes
//! answered ahead, uncommitted changes (replayed there alone after that MDS's restart) and
//! open handles are its own; calls about the whole client (`sync`, `close`, the counts) go
//! through every session.

use std::sync::Arc;

use proto::{Fid, FsErrorKind};

use crate::client::{Client, Inner};
use crate::error::{ClientError, Result};

impl Client {
    /// The MDT whose session `fid` goes through: the one its FID names (MDT0 for a FID no
    /// MDT numbers).
    pub(crate) fn mdt_of(fid: Fid) -> u32 {
        proto::fid::mdt_of(fid).unwrap_or(0)
    }

    /// Whether `fid` is this session's MDT's.
    pub(crate) fn here(&self, fid: Fid) -> bool {
        Self::mdt_of(fid) == self.inner.home
    }

    /// MDT0's session, which holds the others.
    pub(crate) fn top(&self) -> Result<Client> {
        if self.inner.home == 0 {
            return Ok(self.clone());
        }
        let top = self
            .inner
            .top_session()
            .ok_or_else(|| ClientError::fs(FsErrorKind::Invalid, "the client was closed"))?;
        Ok(self.with(top))
    }

    /// The session `fid` goes through, opened if it is not yet.
    pub(crate) async fn at(&self, fid: Fid) -> Result<Client> {
        self.at_mdt(Self::mdt_of(fid)).await
    }

    /// The session with MDT `k`, opened if it is not yet: its MDS pinged, joined (with
    /// commit-behind), and its background work (pings, lease channel, flusher) started.
    pub(crate) async fn at_mdt(&self, k: u32) -> Result<Client> {
        if k == self.inner.home {
            return Ok(self.clone());
        }
        let top = self.top()?;
        if k == 0 {
            return Ok(top);
        }
        if let Some(s) = top.inner.other(k) {
            return Ok(self.with(s));
        }
        let _one = top.inner.opening().lock().await;
        if let Some(s) = top.inner.other(k) {
            return Ok(self.with(s));
        }
        let nid = top.mdt_nid(k).await?;
        let inner = Arc::new(Inner::session(&top.inner, k, nid));
        let session = self.with(inner.clone());
        session.ping().await?;
        if inner.cfg.commit_behind {
            session.join().await?;
        }
        top.inner.adopt(k, inner.clone());
        if inner.cfg.commit_behind && inner.cfg.leases {
            // The lease channel's first wait is answered at once: what the caller asks of
            // this MDT next is leased (a directory met through another MDT's entry is held
            // from its first getattr, as one of MDT0's is from its lookup).
            let start = tokio::time::Instant::now();
            while !inner.leases.live() && start.elapsed() < inner.cfg.attempt {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
        Ok(session)
    }

    /// The session `fid` goes through if it is open now (`None`: nothing of that MDT is
    /// cached, queued or open here).
    pub(crate) fn at_now(&self, fid: Fid) -> Option<Client> {
        let k = Self::mdt_of(fid);
        if k == self.inner.home {
            return Some(self.clone());
        }
        let top = self.top().ok()?;
        if k == 0 {
            return Some(top);
        }
        top.inner.other(k).map(|s| self.with(s))
    }

    /// Every session open now, MDT0's first.
    pub(crate) fn sessions(&self) -> Vec<Client> {
        let Ok(top) = self.top() else {
            return vec![self.clone()];
        };
        let mut all = vec![top.clone()];
        all.extend(top.inner.others_now().into_iter().map(|s| self.with(s)));
        all
    }

    /// The session whose MDS is `peer`, if one is open.
    /// (Asked of every call a client makes, to storage servers too: no list is made.)
    pub(crate) fn session_of_peer(&self, peer: &proto::Nid) -> Option<Client> {
        if *peer == self.inner.mds {
            return Some(self.clone());
        }
        if self.inner.home == 0 {
            return self.inner.other_at(peer).map(|s| self.with(s));
        }
        let top = self.top().ok()?;
        if top.inner.mds == *peer {
            return Some(top);
        }
        top.inner.other_at(peer).map(|s| self.with(s))
    }

    /// `inner`'s session acting as this handle's user.
    fn with(&self, inner: Arc<Inner>) -> Client {
        Client {
            inner,
            creds: self.creds.clone(),
        }
    }
}
