//! What the audit log records of each request: the operation, the paths the MDS resolved, the
//! outcome.

use super::*;

impl MdsService {
    /// The path of entry `name` of directory `parent`, for the audit log.
    pub(super) fn entry_path(
        ns: &crate::namespace::Namespace,
        parent: proto::Fid,
        name: &[u8],
    ) -> String {
        let dir = ns.dir_path(parent).unwrap_or_else(|| parent.to_string());
        let name = String::from_utf8_lossy(name);
        if dir.ends_with('/') {
            format!("{dir}{name}")
        } else {
            format!("{dir}/{name}")
        }
    }

    /// What the audit log records of a mutation, read before it is applied (a removed entry
    /// has no path after); `None` for what is not audited.
    pub(super) fn audited(&self, m: &Mutation) -> Option<Audited> {
        self.audit.as_ref()?;
        let a = |op, fid, path, to, detail| {
            Some(Audited {
                op,
                fid,
                path,
                to,
                detail,
            })
        };
        self.store.read(|ns| match m {
            Mutation::Create {
                parent, name, kind, ..
            }
            | Mutation::CreateAt {
                parent, name, kind, ..
            } => {
                let op = match kind {
                    Kind::Dir => "mkdir",
                    Kind::Symlink => "symlink",
                    Kind::File => "create",
                    _ => "mknod",
                };
                a(
                    op,
                    None,
                    Some(Self::entry_path(ns, *parent, name)),
                    None,
                    None,
                )
            }
            Mutation::MkdirOn {
                parent, name, mdt, ..
            } => a(
                "mkdir",
                None,
                Some(Self::entry_path(ns, *parent, name)),
                None,
                Some(format!("on MDT{mdt}")),
            ),
            Mutation::MkdirStriped {
                parent,
                name,
                count,
                ..
            } => a(
                "mkdir",
                None,
                Some(Self::entry_path(ns, *parent, name)),
                None,
                Some(format!("striped over {count} MDTs")),
            ),
            Mutation::CreateUnnamed { parent, .. } => a(
                "create",
                None,
                ns.dir_path(*parent),
                None,
                Some("no name (O_TMPFILE)".to_owned()),
            ),
            Mutation::Link { fid, parent, name } => a(
                "link",
                Some(*fid),
                Some(Self::entry_path(ns, *parent, name)),
                None,
                None,
            ),
            Mutation::Unlink { parent, name, dir } => {
                let fid = ns.lookup(*parent, name, &Creds::root()).ok().map(|i| i.fid);
                let op = if *dir { "rmdir" } else { "unlink" };
                a(
                    op,
                    fid,
                    Some(Self::entry_path(ns, *parent, name)),
                    None,
                    None,
                )
            }
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ..
            } => {
                let fid = ns.lookup(*parent, name, &Creds::root()).ok().map(|i| i.fid);
                a(
                    "rename",
                    fid,
                    Some(Self::entry_path(ns, *parent, name)),
                    Some(Self::entry_path(ns, *new_parent, new_name)),
                    None,
                )
            }
            Mutation::Setattr { fid, attr } => {
                let mut what = vec![];
                if let Some(m) = attr.mode {
                    what.push(format!("mode={m:o}"));
                }
                if let Some(u) = attr.uid {
                    what.push(format!("uid={u}"));
                }
                if let Some(g) = attr.gid {
                    what.push(format!("gid={g}"));
                }
                if let Some(sz) = attr.size {
                    what.push(format!("size={sz}"));
                }
                if attr.atime.is_some() || attr.mtime.is_some() || attr.times_now {
                    what.push("times".into());
                }
                a(
                    "setattr",
                    Some(*fid),
                    ns.dir_path(*fid),
                    None,
                    Some(what.join(" ")),
                )
            }
            Mutation::SetXattr { fid, name, .. }
            | Mutation::SetXattrIf { fid, name, .. }
            | Mutation::RemoveXattr { fid, name } => a(
                "setxattr",
                Some(*fid),
                ns.dir_path(*fid),
                None,
                Some(name.clone()),
            ),
            Mutation::SetLayout { fid, .. } => {
                a("setstripe", Some(*fid), ns.dir_path(*fid), None, None)
            }
            Mutation::PlaceMirror { fid, mirror, .. } => a(
                "mirror",
                Some(*fid),
                ns.dir_path(*fid),
                None,
                Some(format!("{mirror} placed")),
            ),
            Mutation::MirrorState {
                fid, mirror, stale, ..
            } => a(
                "mirror",
                Some(*fid),
                ns.dir_path(*fid),
                None,
                Some(format!(
                    "{mirror} {}",
                    if *stale { "stale" } else { "in sync" }
                )),
            ),
            // Data kept on the MDS, written.
            Mutation::WriteMdt { fid, offset, data } => a(
                "write",
                Some(*fid),
                ns.dir_path(*fid),
                None,
                Some(format!(
                    "{} bytes at {offset} (kept on the MDS)",
                    data.len()
                )),
            ),
            // Writers' size reports and the MDS's own bookkeeping.
            Mutation::GrowSize { .. }
            | Mutation::Destroyed { .. }
            | Mutation::Released { .. }
            | Mutation::SkipInodes { .. }
            | Mutation::ReserveInodes { .. } => None,
            // The two halves of a mkdir or rmdir across MDTs, asked by the MDS whose client's
            // request is audited there.
            Mutation::MkdirForRemote { .. }
            | Mutation::LinkRemoteDir { .. }
            | Mutation::RmdirRemote { .. }
            | Mutation::MakeShard { .. }
            | Mutation::SetDirStripe { .. }
            | Mutation::FreezeShard { .. }
            | Mutation::RmdirShard { .. }
            | Mutation::MoveOut { .. }
            | Mutation::LinkIn { .. }
            | Mutation::MoveDone { .. }
            | Mutation::MoveAbort { .. }
            | Mutation::DropLink { .. }
            | Mutation::Dropped { .. }
            | Mutation::LinkOut { .. }
            | Mutation::LinkDone { .. }
            | Mutation::LinkAbort { .. }
            | Mutation::PlaceOut { .. }
            | Mutation::PlaceDone { .. }
            | Mutation::PlaceAbort { .. }
            | Mutation::Reparent { .. }
            | Mutation::RenameLock { .. }
            | Mutation::HsmSet { .. }
            | Mutation::HsmLinks { .. }
            | Mutation::HsmImport { .. }
            | Mutation::HsmReimport { .. } => None,
        })
    }

    /// The path an open is recorded under: the one the client named when it names this file
    /// in the namespace now, otherwise none (and the claim, returned second, is recorded as
    /// a claim). A directory's path the MDS knows itself.
    pub(super) fn resolved(
        &self,
        fid: proto::Fid,
        claimed: Option<&str>,
    ) -> (Option<String>, Option<String>) {
        if self.audit.is_none() {
            return (None, None);
        }
        let Some(path) = claimed else {
            return (self.store.read(|ns| ns.dir_path(fid)), None);
        };
        let names: Vec<&str> = path.split('/').filter(|n| !n.is_empty()).collect();
        if path.len() > 4096 || names.len() > MAX_PATH_NAMES {
            return (None, Some(path.chars().take(256).collect()));
        }
        let found = self.store.read(|ns| {
            let mut at = crate::namespace::ROOT;
            for n in &names {
                at = ns.lookup(at, n.as_bytes(), &Creds::root()).ok()?.fid;
            }
            Some(at)
        });
        if found == Some(fid) {
            (Some(path.to_owned()), None)
        } else {
            (None, Some(path.to_owned()))
        }
    }

    /// Records a read of data the MDS keeps (Data-on-MDT).
    pub(super) fn record_mdt_read(
        &self,
        req: &Incoming,
        creds: &Creds,
        fid: proto::Fid,
        offset: u64,
        len: usize,
    ) {
        if self.audit.is_none() {
            return;
        }
        let path = self.store.read(|ns| ns.dir_path(fid));
        let what = Audited {
            op: "read",
            fid: Some(fid),
            path,
            to: None,
            detail: Some(format!("{len} bytes at {offset} (kept on the MDS)")),
        };
        self.record(req, creds, what, None, &Ok::<(), RemoteError>(()));
    }

    /// Writes an audit record for `req`'s caller.
    pub(super) fn record<T>(
        &self,
        req: &Incoming,
        creds: &Creds,
        what: Audited,
        fid: Option<proto::Fid>,
        out: &Result<T, RemoteError>,
    ) {
        let Some(audit) = &self.audit else { return };
        let result = match out {
            Ok(_) => "ok".to_owned(),
            Err(e) => match e.code {
                StatusCode::Fs(k) => format!("{k:?}"),
                other => format!("{other:?}"),
            },
        };
        // A client node's lines are held to its rate; servers' are not.
        audit.record(
            Self::node_of(req),
            &crate::audit::Record {
                time: crate::audit::now(),
                op: what.op,
                node: req.from.to_string(),
                role: match req.role {
                    lnet::auth::Role::Client => "client",
                    lnet::auth::Role::Server => "server",
                },
                uid: creds.uid,
                gid: creds.gid,
                fid: what.fid.or(fid).map(|f| f.to_string()),
                path: what.path,
                to: what.to,
                detail: what.detail,
                result,
            },
        );
    }

    /// Refuses what the audit log must record while it cannot be written: changes, or
    /// (as configured) everything it records.
    pub(super) fn audit_writes(&self, change: bool) -> Result<(), RemoteError> {
        match &self.audit {
            Some(a) if a.refuses(change) => Err(RemoteError::new(
                StatusCode::Io,
                "the audit log cannot be written: what it records is refused until it can",
            )),
            _ => Ok(()),
        }
    }
}
