//! Opens, closes and reopens: the rights an open grants are decided here from the caller's
//! identity, and capabilities granted for them.

use super::*;

impl MdsService {
    /// An open (`MDS_OPEN`): the rights it grants come from the caller's mapped identity and the file's mode; a file it may neither read nor write is not opened.
    pub(super) async fn serve_open(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsOpen = req.decode()?;
        self.owns(req, r.handle.client)?;
        self.audit_writes(false)?;
        if let Some(c) = r.lease {
            self.owns(req, c)?;
        }
        let creds = self.nodemap.map(req, r.creds);
        // A lease asked for is granted before the attributes are read: a change after
        // them recalls it.
        let leased = match self.lessee(r.lease) {
            Some(c) => {
                self.leases.recall_alone(&[r.fid], Some(c)).await;
                self.grant(c, &[r.fid])
            }
            None => false,
        };
        let inode = self
            .store
            .read(|ns| ns.inode(r.fid).cloned())
            .map_err(ns_error)?;
        // The same open again (a resend, or capabilities renewed) keeps what the open
        // was granted; a new one gets what the caller's identity allows, and a file
        // it may neither read nor write is not opened at all.
        let again = self.alloc.open.rights(r.fid, r.handle);
        let allowed = Granter::rights(&inode, &creds, false);
        let (path, claimed) = self.resolved(r.fid, r.path.as_deref());
        let refused = again.is_none() && allowed == 0 && inode.kind == Kind::File;
        let rights = if refused {
            0
        } else {
            self.count_open(r.fid, r.handle, allowed, Self::node_of(req))?
        };
        let inode = if !refused && inode.xattrs.contains_key(proto::hsm::STATE_XATTR) {
            self.hsm_opened(r.fid)?
        } else {
            inode
        };
        let grant = self.granter.grant_rights(&inode, rights);
        let size_gen = self.store.size_gen(r.fid);
        let out = if refused {
            Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::AccessDenied),
                format!("permission denied on {}", r.fid),
            ))
        } else {
            Ok(())
        };
        if self.audit.is_some() {
            let mut access = vec![];
            if rights & proto::capa::READ != 0 {
                access.push("read");
            }
            if rights & proto::capa::WRITE != 0 {
                access.push("write");
            }
            let mut detail = format!("granted {}", access.join("+"));
            if let Some(c) = claimed {
                detail.push_str(&format!("; the client named {c:?}, not this file"));
            }
            let what = Audited {
                op: if again.is_some() { "renew" } else { "open" },
                fid: Some(r.fid),
                path,
                to: None,
                detail: Some(detail),
            };
            self.record(req, &creds, what, None, &out);
        }
        out?;
        // A small file's bytes come with its open (Data-on-MDT).
        let mdt = if rights & proto::capa::READ != 0
            && inode.layout.as_ref().is_some_and(|l| l.mdt_end().is_some())
        {
            let data = self
                .store
                .read(|ns| ns.read_mdt(r.fid, 0, proto::layout::MAX_MDT_SIZE))
                .map_err(ns_error)?;
            self.record_mdt_read(req, &creds, r.fid, 0, data.len());
            data
        } else {
            vec![]
        };
        reply::<MdsOpen>(&MdsOpened {
            inode,
            size_gen,
            grant,
            mdt,
            leased,
        })
    }

    /// A close (`MDS_CLOSE`) of one of the caller's own handles.
    pub(super) fn serve_close(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsClose = req.decode()?;
        self.owns(req, r.handle.client)?;
        self.alloc.open.close(r.fid, r.handle);
        reply::<MdsClose>(&MdsOpenDone {})
    }

    /// The opens a client held, again after a restart (`MDS_REOPEN`).
    pub(super) fn serve_reopen(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let r: MdsReopen = req.decode()?;
        for (_, h) in &r.handles {
            self.owns(req, h.client)?;
        }
        self.reopen(r, Self::node_of(req))
    }

    /// A client counts again, after a restart, the files it holds open: each one the
    /// namespace still has, by a name or by objects kept for removal, is counted.
    pub(super) fn reopen(
        &self,
        r: MdsReopen,
        node: Option<std::net::IpAddr>,
    ) -> Result<Vec<u8>, RemoteError> {
        if r.handles.len() > MAX_REOPEN {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::Invalid),
                format!(
                    "{} handles in one reopen, past {MAX_REOPEN}",
                    r.handles.len()
                ),
            ));
        }
        let fids: Vec<proto::Fid> = r.handles.iter().map(|(f, _)| *f).collect();
        let kept = self.store.read(|ns| ns.still_kept(&fids));
        let mut gone = vec![];
        for (fid, handle) in r.handles {
            if !kept.contains(&fid) {
                gone.push(fid);
                continue;
            }
            self.count_open(fid, handle, 0, node)?;
        }
        if !gone.is_empty() {
            tracing::warn!(files = gone.len(), "reopened files are gone");
        }
        reply::<MdsReopen>(&MdsReopened { gone })
    }

    /// Counts the open `handle` of `fid` granted `rights`; the rights the handle holds now.
    pub(super) fn count_open(
        &self,
        fid: proto::Fid,
        handle: OpenHandle,
        rights: u8,
        node: Option<std::net::IpAddr>,
    ) -> Result<u8, RemoteError> {
        self.alloc
            .open
            .open(fid, handle, rights, node)
            .map_err(|e| {
                ns_error(NsError {
                    kind: FsErrorKind::TooManyOpen,
                    what: e.to_string(),
                })
            })
    }
}
