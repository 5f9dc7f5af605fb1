//! The metadata service as the network sees it: the registry of targets and the namespace.
//!
//! Callers state their own uid and groups, as NFS's AUTH_SYS and Lustre without Kerberos do;
//! the nodemap ([`crate::identity`]) decides what that claim is worth from the node it comes
//! from (root squashed unless the node is trusted). Only servers may register or heartbeat
//! targets. Opens come with capabilities for the file's objects.

use std::collections::HashSet;
use std::sync::Arc;

use lnet::service::{reply, BoxFuture, BulkPeer, Incoming, Service};
use proto::layout::StripeObject;
use proto::md::*;
use proto::msg::opcodes;
use proto::registry::*;
use proto::{FsErrorKind, RemoteError, StatusCode};

use proto::layout::{Component, Layout, StripeCount, DEFAULT_STRIPE_SIZE};

use crate::alloc::Allocator;
use crate::audit::Audit;
use crate::identity::{Granter, Nodemap};
use crate::journal::Ticket;
use crate::lease::Leases;
use crate::namespace::{Decision, NsError};
use crate::recovery::Clients;
use crate::registry::{Registry, RegistryError};
use crate::store::{Store, StoreError};

/// How long a create waits for a maintenance pass when no target is in service yet, before it
/// answers Busy (well within a client's attempt time).
const MAINTAIN_IN_REQUEST: std::time::Duration = std::time::Duration::from_secs(1);

pub struct MdsService {
    registry: Arc<Registry>,
    store: Arc<Store>,
    alloc: Arc<Allocator>,
    /// This run of the MDS, as pings answer it.
    instance: u64,
    nodemap: Nodemap,
    granter: Granter,
    audit: Option<Arc<Audit>>,
    metrics: Option<Arc<crate::metrics::MdsMetrics>>,
    /// Clients that keep uncommitted changes, and the recovery after a restart.
    clients: Arc<Clients>,
    /// What clients may answer from their caches.
    leases: Arc<Leases>,
    /// The client ids each connection used.
    peers: crate::peers::Peers,
}

/// What the MDS lets callers do and records of it: the nodemap, the capabilities it grants,
/// and the audit log.
pub struct Policy {
    pub nodemap: Nodemap,
    pub granter: Granter,
    pub audit: Option<Arc<Audit>>,
    /// Where changes and journal commits are counted, for the metrics endpoint.
    pub metrics: Option<Arc<crate::metrics::MdsMetrics>>,
}

/// What a replay ticket's seal covers besides the ticket: its purpose and its client.
fn ticket_context(client: u128) -> Vec<u8> {
    let mut what = b"replay ticket ".to_vec();
    what.extend_from_slice(&client.to_be_bytes());
    what
}

/// Opcodes served while clients replay after a restart; the rest are answered Busy.
const SERVED_IN_RECOVERY: &[proto::msg::Opcode] = &[
    opcodes::MDS_REGISTER_TARGETS,
    opcodes::MDS_HEARTBEAT,
    opcodes::MDS_LIST_TARGETS,
    opcodes::MDS_PING,
    opcodes::MDS_CONNECT,
    opcodes::MDS_REPLAY,
    opcodes::MDS_REPLAY_DONE,
    opcodes::MDS_DISCONNECT,
    opcodes::MDS_REOPEN,
    opcodes::MDS_STATFS,
];

/// What an audit record says of an operation before it runs.
struct Audited {
    op: &'static str,
    fid: Option<proto::Fid>,
    path: Option<String>,
    to: Option<String>,
    detail: Option<String>,
}

fn ns_error(e: NsError) -> RemoteError {
    RemoteError::new(StatusCode::Fs(e.kind), e.what)
}

/// An allocation that failed: a target taken out of service while the objects were chosen
/// is Busy (the client resends, and the objects are chosen again); the rest as the namespace
/// says.
fn alloc_error(e: NsError) -> RemoteError {
    if e.kind == FsErrorKind::WouldBlock {
        return RemoteError::new(StatusCode::Busy, e.what);
    }
    ns_error(e)
}

fn store_error(e: StoreError) -> RemoteError {
    match e {
        StoreError::Namespace(e) => ns_error(e),
        StoreError::StaleRequest => {
            RemoteError::new(StatusCode::Fs(FsErrorKind::Stale), e.to_string())
        }
        other => RemoteError::new(StatusCode::Io, other.to_string()),
    }
}

impl MdsService {
    /// The service of one run of the MDS, named `instance` (nonzero; pings answer with it).
    pub fn new(
        registry: Arc<Registry>,
        store: Arc<Store>,
        alloc: Arc<Allocator>,
        instance: u64,
        policy: Policy,
        clients: Arc<Clients>,
    ) -> Arc<Self> {
        if let Some(m) = &policy.metrics {
            store.set_metrics(m.clone());
        }
        // Epochs follow the run's instance: random, unless a simulation named it.
        let leases = Arc::new(Leases::default().epochs_from(instance));
        alloc.recall_through(leases.clone());
        Arc::new(MdsService {
            registry,
            store,
            alloc,
            instance: instance.max(1),
            nodemap: policy.nodemap,
            granter: policy.granter,
            audit: policy.audit,
            metrics: policy.metrics,
            clients,
            leases,
            peers: Default::default(),
        })
    }

    /// The path of entry `name` of directory `parent`, for the audit log.
    fn entry_path(ns: &crate::namespace::Namespace, parent: proto::Fid, name: &[u8]) -> String {
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
    fn audited(&self, m: &Mutation) -> Option<Audited> {
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
        })
    }

    /// The path an open is recorded under: the one the client named when it names this file
    /// in the namespace now, otherwise none (and the claim, returned second, is recorded as
    /// a claim). A directory's path the MDS knows itself.
    fn resolved(&self, fid: proto::Fid, claimed: Option<&str>) -> (Option<String>, Option<String>) {
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
    fn record_mdt_read(
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
    fn record<T>(
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

    /// Refuses a recovery message meant for another run of the MDS (an earlier one: the
    /// client connects again and replays in this run's recovery).
    fn same_run(&self, instance: u64) -> Result<(), RemoteError> {
        if instance == self.instance {
            return Ok(());
        }
        Err(RemoteError::new(
            StatusCode::Fs(FsErrorKind::Stale),
            format!(
                "a recovery message for MDS run {instance:x}; this is run {:x}",
                self.instance
            ),
        ))
    }

    /// Refuses what the audit log must record while it cannot be written: changes, or
    /// (as configured) everything it records.
    fn audit_writes(&self, change: bool) -> Result<(), RemoteError> {
        match &self.audit {
            Some(a) if a.refuses(change) => Err(RemoteError::new(
                StatusCode::Io,
                "the audit log cannot be written: what it records is refused until it can",
            )),
            _ => Ok(()),
        }
    }

    /// Refuses a client id past what one connection may use ([`crate::peers`]); servers are
    /// trusted with any.
    fn owns(&self, req: &Incoming, client: u128) -> Result<(), RemoteError> {
        if req.role == lnet::auth::Role::Server || self.peers.admit(&req.from, client) {
            return Ok(());
        }
        tracing::warn!(peer = %req.from, "a connection named more client ids than it may");
        Err(RemoteError::new(
            StatusCode::Fs(FsErrorKind::NotPermitted),
            format!(
                "one connection may use at most {} client ids",
                crate::peers::IDS_PER_CONNECTION
            ),
        ))
    }

    /// Registering and heartbeating targets is for servers, which hold the cluster key.
    fn server_only(&self, req: &Incoming) -> Result<(), RemoteError> {
        if req.role == lnet::auth::Role::Server {
            return Ok(());
        }
        tracing::warn!(peer = %req.from, opcode = ?req.opcode, "a client asked for a server's operation");
        Err(RemoteError::new(
            StatusCode::Fs(FsErrorKind::NotPermitted),
            format!("{:?} is for servers only", req.opcode),
        ))
    }

    /// A layout with objects for a new file, from `template` (or the default), when there are
    /// targets to put them on; otherwise the template as it is (metadata only, until storage
    /// registers).
    async fn objects_for(
        &self,
        template: Option<Layout>,
    ) -> Result<(Option<Layout>, Vec<StripeObject>), RemoteError> {
        // One look at the registry for the whole create, unless no target is in service.
        let mut known = self.registry.targets();
        let registered = !known.is_empty();
        if !self.alloc.has_targets_in(&known) && registered {
            // A pass may bring a target into service now; a long one (a big orphan cleanup)
            // goes on in the background while this request is answered Busy and resent.
            let pass = self.alloc.maintain(&self.store);
            let _ = tokio::time::timeout(MAINTAIN_IN_REQUEST, pass).await;
            known = self.registry.list().into();
        }
        if !self.alloc.has_targets_in(&known) {
            if registered {
                // Targets exist but none is in service yet (after an MDS restart, before
                // their orphans are cleaned up): a file made now would have no objects for
                // good. The client resends.
                return Err(RemoteError::new(
                    StatusCode::Busy,
                    "no storage target is in service yet",
                ));
            }
            return Ok((template, vec![]));
        }
        let template = template.unwrap_or_else(default_layout);
        // Checked before anything is allocated: a bad template costs no storage server work.
        template.validate().map_err(|e| {
            ns_error(NsError {
                kind: FsErrorKind::Invalid,
                what: e.to_string(),
            })
        })?;
        let layout = self
            .alloc
            .instantiate_among(&template, &Default::default(), &known)
            .await
            .map_err(alloc_error)?;
        let objects = objects_of(&layout);
        Ok((Some(layout), objects))
    }

    /// Fills in what only the MDS decides before a mutation is applied: the objects of a new
    /// file, or of an empty file getting a layout. A layout from the network must not name
    /// objects: only the MDS hands them out.
    async fn prepare(&self, m: &mut Mutation) -> Result<Vec<StripeObject>, RemoteError> {
        let forged = |l: &Layout| l.components.iter().any(|c| !c.objects.is_empty());
        let refuse = |kind, what: &str| {
            Err(ns_error(NsError {
                kind,
                what: what.into(),
            }))
        };
        match m {
            Mutation::Create {
                kind: Kind::File,
                layout,
                parent,
                ..
            }
            | Mutation::CreateAt {
                kind: Kind::File,
                layout,
                parent,
                ..
            }
            | Mutation::CreateUnnamed { layout, parent, .. } => {
                if layout.as_ref().is_some_and(forged) {
                    return refuse(
                        FsErrorKind::Invalid,
                        "a layout from a client cannot name objects",
                    );
                }
                let parent = *parent;
                let template = match layout.take() {
                    Some(l) => Some(l),
                    None => self
                        .store
                        .read(|ns| ns.inode(parent).ok().and_then(|p| p.layout.clone())),
                };
                let (l, objects) = self.objects_for(template).await?;
                *layout = l;
                Ok(objects)
            }
            Mutation::SetLayout { fid, layout } => {
                if forged(layout) {
                    return refuse(
                        FsErrorKind::Invalid,
                        "a layout from a client cannot name objects",
                    );
                }
                let fid = *fid;
                let is_file = self
                    .store
                    .read(|ns| ns.inode(fid).map(|i| i.kind == Kind::File))
                    .map_err(ns_error)?;
                if !is_file {
                    return Ok(vec![]); // a directory's default stays a template
                }
                let (l, objects) = self.objects_for(Some(layout.clone())).await?;
                if let Some(l) = l {
                    *layout = l;
                }
                Ok(objects)
            }
            Mutation::PlaceMirror {
                fid,
                mirror,
                generation,
                exclude,
                components,
            } => {
                if !components.is_empty() {
                    return refuse(
                        FsErrorKind::Invalid,
                        "a client cannot name a mirror's components: the MDS places them",
                    );
                }
                let (fid, mirror) = (*fid, *mirror);
                let current = self
                    .store
                    .read(|ns| {
                        ns.may_place_mirror(fid, mirror, *generation, &Creds::root())
                            .cloned()
                    })
                    .map_err(ns_error)?;
                // The other mirrors as they are; this one as a template, like a new file's.
                let pattern: Vec<Component> = if mirror < current.mirror_count() {
                    current
                        .components
                        .iter()
                        .filter(|c| c.mirror == mirror)
                        .cloned()
                        .collect()
                } else {
                    current
                        .components
                        .iter()
                        .filter(|c| c.mirror == 0)
                        .cloned()
                        .collect()
                };
                let mut template = current.clone();
                template.components.retain(|c| c.mirror != mirror);
                template
                    .components
                    .extend(pattern.into_iter().map(|c| Component {
                        stripe_offset: None,
                        targets: vec![],
                        objects: vec![],
                        mirror,
                        stale: true,
                        ..c
                    }));
                // In mirror order, as a layout keeps them (stable: extents stay in order).
                template.components.sort_by_key(|c| c.mirror);
                if !self.alloc.has_targets() {
                    return Err(RemoteError::new(
                        StatusCode::Busy,
                        "no storage target is in service yet",
                    ));
                }
                let exclude: HashSet<u32> = exclude.iter().copied().collect();
                let placed = self
                    .alloc
                    .instantiate_excluding(&template, &exclude)
                    .await
                    .map_err(alloc_error)?;
                let mine: Vec<Component> = placed
                    .components
                    .into_iter()
                    .filter(|c| c.mirror == mirror)
                    .collect();
                let objects = mine
                    .iter()
                    .flat_map(|c| c.objects.iter().copied())
                    .collect();
                *components = mine;
                Ok(objects)
            }
            Mutation::Destroyed { .. } | Mutation::Released { .. } => refuse(
                FsErrorKind::NotPermitted,
                "only the MDS records destroyed objects and released files",
            ),
            Mutation::SkipInodes { .. } | Mutation::ReserveInodes { .. } => refuse(
                FsErrorKind::NotPermitted,
                "only the MDS skips or sets aside inode numbers",
            ),
            _ => Ok(vec![]),
        }
    }

    async fn dispatch(&self, req: Incoming) -> Result<Vec<u8>, RemoteError> {
        if !SERVED_IN_RECOVERY.contains(&req.opcode) && self.clients.recovering() {
            return Err(RemoteError::new(
                StatusCode::Busy,
                "the MDS is recovering: clients are replaying their changes",
            ));
        }
        match req.opcode {
            opcodes::MDS_REGISTER_TARGETS => {
                self.server_only(&req)?;
                self.register(req.decode()?)
            }
            opcodes::MDS_HEARTBEAT => {
                self.server_only(&req)?;
                let r: Heartbeat = req.decode()?;
                self.registry.heartbeat(&r.oss, &r.rails, &r.targets);
                self.alloc.peer_rails(&r.oss, &r.rails);
                reply::<Heartbeat>(&HeartbeatAck {})
            }
            opcodes::MDS_LIST_TARGETS => {
                let _: ListTargets = req.decode()?;
                let mut targets = self.registry.list();
                self.alloc.mark_takes_stripes(&mut targets);
                reply::<ListTargets>(&TargetList { targets })
            }
            opcodes::MDS_REINT => {
                let r: MdsReint = req.decode()?;
                let out = self.reint_from(&req, r).await?;
                reply::<MdsReint>(&out)
            }
            opcodes::MDS_BATCH => {
                let r: MdsBatch = req.decode()?;
                if r.ops.len() > MAX_BATCH {
                    return Err(RemoteError::new(
                        StatusCode::Fs(FsErrorKind::Invalid),
                        format!("{} operations in one batch, past {MAX_BATCH}", r.ops.len()),
                    ));
                }
                let mut results = Vec::with_capacity(r.ops.len());
                // An operation refused for now (Busy: no storage target in service yet) stops
                // the batch there: the later ones may depend on it, and the client sends them
                // all again, in order.
                let mut busy: Option<RemoteError> = None;
                for op in r.ops {
                    if let Some(e) = &busy {
                        results.push(BatchResult::Failed(e.clone()));
                        continue;
                    }
                    let out = match op {
                        BatchOp::Reint(r) => self.reint_from(&req, r).await.map(BatchResult::Reint),
                        BatchOp::Close(c) => self.owns(&req, c.handle.client).map(|_| {
                            self.alloc.open.close(c.fid, c.handle);
                            BatchResult::Closed
                        }),
                    };
                    if let Err(e) = &out {
                        if e.code == StatusCode::Busy {
                            busy = Some(e.clone());
                        }
                    }
                    results.push(out.unwrap_or_else(BatchResult::Failed));
                }
                // The attributes a change left on an inode that a later change of the batch
                // touched too are of no use to the client: only the last are sent.
                let mut later = std::collections::HashSet::new();
                for r in results.iter_mut().rev() {
                    if let BatchResult::Reint(reply) = r {
                        reply.after.retain(|i| later.insert(i.fid));
                    }
                }
                reply::<MdsBatch>(&MdsBatched { results })
            }
            opcodes::MDS_RESERVE => {
                let r: MdsReserve = req.decode()?;
                self.owns(&req, r.client)?;
                self.reserve(r).await
            }
            opcodes::MDS_OPEN => {
                let r: MdsOpen = req.decode()?;
                self.owns(&req, r.handle.client)?;
                self.audit_writes(false)?;
                if let Some(c) = r.lease {
                    self.owns(&req, c)?;
                }
                let creds = self.nodemap.map(&req, r.creds);
                // A lease asked for is granted before the attributes are read: a change after
                // them recalls it.
                let leased = match self.lessee(r.lease) {
                    Some(c) => {
                        self.leases.recall_alone(&[r.fid], Some(c)).await;
                        self.leases.grant(c, &[r.fid])
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
                    self.count_open(r.fid, r.handle, allowed, Self::node_of(&req))?
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
                    self.record(&req, &creds, what, None, &out);
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
                    self.record_mdt_read(&req, &creds, r.fid, 0, data.len());
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
            opcodes::MDS_CLOSE => {
                let r: MdsClose = req.decode()?;
                self.owns(&req, r.handle.client)?;
                self.alloc.open.close(r.fid, r.handle);
                reply::<MdsClose>(&MdsOpenDone {})
            }
            opcodes::MDS_REOPEN => {
                let r: MdsReopen = req.decode()?;
                for (_, h) in &r.handles {
                    self.owns(&req, h.client)?;
                }
                self.reopen(r, Self::node_of(&req))
            }
            opcodes::MDS_PING => {
                let r: MdsPing = req.decode()?;
                self.owns(&req, r.client)?;
                self.alloc.open.seen(r.client);
                self.clients.seen(r.client);
                reply::<MdsPing>(&MdsPong {
                    instance: self.instance,
                    committed: self.store.committed(),
                })
            }
            opcodes::MDS_CONNECT => {
                let r: MdsConnect = req.decode()?;
                self.owns(&req, r.client)?;
                let recovering = self
                    .clients
                    .connect(r.client)
                    .map_err(|e| RemoteError::new(StatusCode::Io, e.to_string()))?;
                reply::<MdsConnect>(&MdsConnected {
                    instance: self.instance,
                    committed: self.store.committed(),
                    recovering,
                })
            }
            opcodes::MDS_DISCONNECT => {
                let r: MdsDisconnect = req.decode()?;
                self.owns(&req, r.client)?;
                self.clients
                    .disconnect(r.client)
                    .map_err(|e| RemoteError::new(StatusCode::Io, e.to_string()))?;
                self.leases.forget(r.client);
                reply::<MdsDisconnect>(&MdsDisconnected {})
            }
            opcodes::MDS_REPLAY => {
                let r: MdsReplay = req.decode()?;
                self.owns(&req, r.client)?;
                self.same_run(r.instance)?;
                let ticket = self.unseal(r.client, &r.ticket)?;
                let outcome = self
                    .clients
                    .replay(r.client, r.transno, ticket)
                    .await
                    .map_err(|why| RemoteError::new(StatusCode::Io, why))?;
                reply::<MdsReplay>(&MdsReplayed { outcome })
            }
            opcodes::MDS_REPLAY_DONE => {
                let r: MdsReplayDone = req.decode()?;
                self.same_run(r.instance)?;
                self.clients.replay_done(r.client);
                reply::<MdsReplayDone>(&MdsReplayDoneAck {})
            }
            opcodes::MDS_LEASE_WAIT => {
                let r: MdsLeaseWait = req.decode()?;
                self.owns(&req, r.client)?;
                if !self.clients.holds(r.client) {
                    return Err(RemoteError::new(
                        StatusCode::Fs(FsErrorKind::NotPermitted),
                        "leases are for clients that joined (MDS_CONNECT)",
                    ));
                }
                let idmap = self.nodemap.idmap(&req);
                let recall = self
                    .leases
                    .wait(
                        r.client,
                        r.nr,
                        r.acked,
                        r.epoch,
                        &r.cancel,
                        self.instance,
                        idmap,
                    )
                    .await;
                reply::<MdsLeaseWait>(&recall)
            }
            opcodes::MDS_SYNC => {
                let _: MdsSync = req.decode()?;
                let committed = self.store.sync().await.map_err(store_error)?;
                reply::<MdsSync>(&MdsSynced {
                    committed,
                    instance: self.instance,
                })
            }
            opcodes::MDS_STATFS => {
                let _: MdsStatfs = req.decode()?;
                self.statfs()
            }
            opcodes::MDS_MIRROR_SCAN => {
                // A scan lists files by FID, past every directory's permissions: it is for
                // administrators (the cluster key, or root on a trusted node).
                let map = self.nodemap.idmap(&req);
                if !map.identity && !map.trusted {
                    return Err(RemoteError::new(
                        StatusCode::Fs(FsErrorKind::NotPermitted),
                        "the mirror scan is for administrators (the cluster key, or root on a \
                         trusted node)",
                    ));
                }
                let r: MdsMirrorScan = req.decode()?;
                self.mirror_scan(r)
            }
            opcodes::MDS_LOOKUP => {
                let mut r: MdsLookup = req.decode()?;
                r.creds = self.nodemap.map(&req, r.creds);
                // A directory another client holds alone: what it answered ahead comes first.
                self.leases.recall_alone(&[r.parent], r.lease).await;
                // Granted before the state is read: a change after the grant recalls it.
                let client = self.lessee(r.lease);
                let mut leased = client.is_some_and(|c| self.leases.grant(c, &[r.parent]));
                let mut inode = self
                    .store
                    .read(|ns| ns.lookup(r.parent, &r.name, &r.creds).cloned())
                    .map_err(ns_error)?;
                if let Some(c) = client.filter(|_| leased) {
                    leased = self.leases.grant(c, &[inode.fid]);
                    if leased {
                        // Read again, after the grant.
                        match self.store.read(|ns| ns.inode(inode.fid).cloned()) {
                            Ok(i) => inode = i,
                            Err(_) => leased = false,
                        }
                    }
                }
                let (inode, whole) = shown(inode, &r.creds);
                reply::<MdsLookup>(&MdsInode {
                    inode,
                    leased: leased && whole,
                })
            }
            opcodes::MDS_LOOKUP_PATH => {
                let mut r: MdsLookupPath = req.decode()?;
                r.creds = self.nodemap.map(&req, r.creds);
                if r.names.len() > MAX_PATH_NAMES {
                    return Err(RemoteError::new(
                        StatusCode::Fs(FsErrorKind::Invalid),
                        format!(
                            "{} names in one lookup, past {MAX_PATH_NAMES}",
                            r.names.len()
                        ),
                    ));
                }
                // The inodes walked, and every directory looked in (a failed lookup too).
                let walk = || {
                    self.store.read(|ns| {
                        let mut out: Vec<Inode> = vec![];
                        let mut dirs = vec![r.dir];
                        let mut dir = r.dir;
                        for n in &r.names {
                            let i = match ns.lookup(dir, &n.0, &r.creds) {
                                Ok(i) => i,
                                Err(e) => return (dirs, Err(e)),
                            };
                            dir = i.fid;
                            out.push(i.clone());
                            if i.kind == Kind::Symlink {
                                break; // the client follows it
                            }
                            if i.kind == Kind::Dir {
                                dirs.push(i.fid);
                            }
                        }
                        (dirs, Ok(out))
                    })
                };
                // A directory held alone by a client is recalled first (what it answered ahead
                // comes first), and the walk made again.
                let (mut dirs, mut walked) = walk();
                for _ in 0..MAX_PATH_NAMES {
                    if !self.leases.held_alone(&dirs, None) {
                        break;
                    }
                    self.leases.recall_alone(&dirs, None).await;
                    (dirs, walked) = walk();
                }
                let inodes = walked
                    .map_err(ns_error)?
                    .into_iter()
                    .map(|i| shown(i, &r.creds).0)
                    .collect();
                reply::<MdsLookupPath>(&MdsPath { inodes })
            }
            opcodes::MDS_GETATTR => {
                let mut r: MdsGetattr = req.decode()?;
                r.creds = self.nodemap.map(&req, r.creds);
                self.leases.recall_alone(&[r.fid], r.lease).await;
                let leased = self
                    .lessee(r.lease)
                    .is_some_and(|c| self.leases.grant(c, &[r.fid]));
                let inode = self
                    .store
                    .read(|ns| ns.inode(r.fid).cloned())
                    .map_err(ns_error)?;
                let (inode, whole) = shown(inode, &r.creds);
                reply::<MdsGetattr>(&MdsInode {
                    inode,
                    leased: leased && whole,
                })
            }
            opcodes::MDS_READ_MDT => {
                let mut r: MdsReadMdt = req.decode()?;
                r.creds = self.nodemap.map(&req, r.creds);
                self.audit_writes(false)?;
                if r.len as u64 > proto::layout::MAX_MDT_SIZE {
                    return Err(RemoteError::new(
                        StatusCode::Fs(FsErrorKind::Invalid),
                        format!(
                            "a read of the MDS's part is at most {} bytes",
                            proto::layout::MAX_MDT_SIZE
                        ),
                    ));
                }
                // Through an open handle granted read, the open was the check; otherwise the
                // caller's read permission.
                let by_handle = r
                    .handle
                    .and_then(|h| self.alloc.open.rights(r.fid, h))
                    .is_some_and(|rights| rights & proto::capa::READ != 0);
                let leased = self
                    .lessee(r.lease)
                    .is_some_and(|c| self.leases.grant(c, &[r.fid]));
                let (data, inode) = self
                    .store
                    .read(|ns| {
                        let inode = ns.inode(r.fid)?.clone();
                        if !by_handle && !inode.permits(&r.creds, 4) {
                            return Err(NsError {
                                kind: FsErrorKind::AccessDenied,
                                what: format!("permission denied on {}", r.fid),
                            });
                        }
                        Ok((ns.read_mdt(r.fid, r.offset, u64::from(r.len))?, inode))
                    })
                    .map_err(ns_error)?;
                self.record_mdt_read(&req, &r.creds, r.fid, r.offset, data.len());
                reply::<MdsReadMdt>(&MdsMdtData {
                    data,
                    inode,
                    leased,
                })
            }
            opcodes::MDS_READDIR => {
                let mut r: MdsReaddir = req.decode()?;
                r.creds = self.nodemap.map(&req, r.creds);
                self.leases.recall_alone(&[r.dir], r.lease).await;
                self.readdir(r)
            }
            opcodes::MDS_LEASE_ALONE => {
                let r: MdsLeaseAlone = req.decode()?;
                let granted = self
                    .lessee(Some(r.client))
                    .is_some_and(|c| self.leases.grant_alone(c, r.dir));
                reply::<MdsLeaseAlone>(&MdsLeaseAloneReply { granted })
            }
            other => Err(RemoteError::new(
                StatusCode::NoService,
                format!("the MDS does not serve {other:?}"),
            )),
        }
    }
}

impl MdsService {
    /// A storage server's targets, registered: their indices (durable before the answer).
    fn register(&self, r: RegisterTargets) -> Result<Vec<u8>, RemoteError> {
        self.alloc.peer_rails(&r.oss, &r.rails);
        let indices = self
            .registry
            .register(&r.oss, &r.rails, &r.targets)
            .map_err(|e| {
                let code = match e {
                    RegistryError::IndexTaken { .. } => StatusCode::Exists,
                    RegistryError::Full => StatusCode::NoSpace,
                    RegistryError::OtherFilesystem { .. } | RegistryError::UnknownIndex { .. } => {
                        tracing::error!(oss = %r.oss, error = %e, "refused a storage server's targets");
                        StatusCode::Refused
                    }
                    _ => StatusCode::Io,
                };
                RemoteError::new(code, e.to_string())
            })?;
        self.alloc.registered(&indices);
        let fs = self.registry.filesystem();
        reply::<RegisterTargets>(&Registered {
            indices,
            fs: fs.uuid,
            fs_name: fs.name.clone(),
        })
    }

    /// Inodes, and the space of the targets that are up.
    /// Files whose mirrors need care: stale ones, or those with objects on a target.
    fn mirror_scan(&self, r: MdsMirrorScan) -> Result<Vec<u8>, RemoteError> {
        let max = r.max.clamp(1, MAX_MIRROR_SCAN) as usize;
        let on = |l: &Layout, t: u32| -> Vec<u16> {
            let mut ms: Vec<u16> = l
                .components
                .iter()
                .filter(|c| c.objects.iter().any(|o| o.target == t))
                .map(|c| c.mirror)
                .collect();
            ms.dedup();
            ms
        };
        let (files, end) = self.store.read(|ns| {
            let (found, end) = ns.mirrored_files(r.after, max, |l| {
                (!r.stale || !l.stale_mirrors().is_empty())
                    && r.target.is_none_or(|t| !on(l, t).is_empty())
            });
            let files = found
                .into_iter()
                .map(|i| {
                    let l = i.layout.as_ref().expect("picked by its layout");
                    let stale = l.stale_mirrors();
                    let mut stale_targets: Vec<u32> = l
                        .components
                        .iter()
                        .filter(|c| c.stale)
                        .flat_map(|c| c.objects.iter().map(|o| o.target))
                        .collect();
                    stale_targets.sort_unstable();
                    stale_targets.dedup();
                    ScannedFile {
                        fid: i.fid,
                        size: i.size,
                        mirrors: l.mirror_count(),
                        stale,
                        on_target: r.target.map(|t| on(l, t)).unwrap_or_default(),
                        stale_targets,
                        open: self.alloc.open.is_open(i.fid),
                    }
                })
                .collect();
            (files, end)
        });
        reply::<MdsMirrorScan>(&MdsMirrorScanned { files, end })
    }

    fn statfs(&self) -> Result<Vec<u8>, RemoteError> {
        let targets = self.registry.list();
        let up: Vec<_> = targets.iter().filter(|t| t.up).collect();
        reply::<MdsStatfs>(&FsStats {
            inodes: self.store.read(|ns| ns.len() as u64),
            total: up.iter().map(|t| t.total).sum(),
            free: up.iter().map(|t| t.free).sum(),
            targets: targets.len() as u32,
            targets_up: up.len() as u32,
        })
    }

    /// An inode's attributes as readdirplus sends them: without xattrs, layout or target.
    fn bare(i: &Inode) -> Inode {
        Inode {
            xattrs: Default::default(),
            layout: None,
            target: vec![],
            ..i.clone()
        }
    }

    /// The client a request's leases go to: one that asked and joined the table of clients.
    fn lessee(&self, asked: Option<u128>) -> Option<u128> {
        asked.filter(|c| self.clients.holds(*c))
    }

    /// The leases granted, for tests and statistics.
    pub fn leases(&self) -> &Arc<Leases> {
        &self.leases
    }

    /// One page of a directory, cut to fit a reply whatever the names' length; with `plus`,
    /// each entry's attributes (without xattrs, layout or target).
    fn readdir(&self, r: MdsReaddir) -> Result<Vec<u8>, RemoteError> {
        let max = r.max.clamp(1, MAX_READDIR) as usize;
        let after = (!r.after.is_empty()).then_some(&r.after[..]);
        let client = self.lessee(r.lease);
        let mut leased = client.is_some_and(|c| self.leases.grant(c, &[r.dir]));
        let (entries, mut attrs, max) = self
            .store
            .read(|ns| {
                let mut entries = ns.readdir(r.dir, after, max + 1, &r.creds)?;
                // A page stays well under the largest body, whatever the names' length.
                let per_entry = if r.plus { 192 } else { 32 };
                let mut budget = proto::frame::MAX_BODY as usize / 2;
                let fits = entries
                    .iter()
                    .position(|(name, ..)| {
                        budget = budget.saturating_sub(name.len() + per_entry);
                        budget == 0
                    })
                    .unwrap_or(entries.len());
                let max = max.min(fits.max(1));
                entries.truncate(max + 1);
                let attrs: Vec<Inode> = if r.plus {
                    entries
                        .iter()
                        .take(max)
                        .filter_map(|(_, fid, _)| ns.inode(*fid).ok())
                        .map(Self::bare)
                        .collect()
                } else {
                    vec![]
                };
                Ok((entries, attrs, max))
            })
            .map_err(ns_error)?;
        let end = entries.len() <= max;
        let entries: Vec<DirEntry> = entries
            .into_iter()
            .take(max)
            .map(|(name, fid, kind)| DirEntry { name, fid, kind })
            .collect();
        if let Some(c) = client.filter(|_| leased && r.plus) {
            // The entries' leases, then their attributes read again after the grant.
            let fids: Vec<proto::Fid> = attrs.iter().map(|i| i.fid).collect();
            leased = self.leases.grant(c, &fids);
            if leased {
                let fresh: Vec<Inode> = self.store.read(|ns| {
                    fids.iter()
                        .filter_map(|f| ns.inode(*f).ok())
                        .map(Self::bare)
                        .collect()
                });
                leased = fresh.len() == attrs.len();
                attrs = fresh;
            }
        }
        reply::<MdsReaddir>(&MdsDirPage {
            entries,
            attrs,
            end,
            leased,
        })
    }

    /// One mutation: decided in the namespace first (a resend is answered as then, an
    /// `O_CREAT` of an existing file opens it without a change), objects taken only for a
    /// change that goes ahead, the open counted with it when asked.
    /// A change from the network: mapped to the identity the MDS gives the caller, audited,
    /// and, for a create at a FID of the client's choosing, checked against what the MDS set
    /// aside for that client.
    async fn reint_from(
        &self,
        req: &Incoming,
        mut r: MdsReint,
    ) -> Result<MdsReintReply, RemoteError> {
        r.creds = self.nodemap.map(req, r.creds);
        if let Some(q) = r.req {
            self.owns(req, q.client)?;
        }
        if let Some(h) = r.open {
            self.owns(req, h.client)?;
        }
        if let Mutation::CreateAt { fid, .. } = &r.mutation {
            let mine = r.req.is_some_and(|q| {
                self.clients.holds(q.client) && self.clients.reserved.holds(q.client, *fid)
            });
            if !mine {
                return Err(RemoteError::new(
                    StatusCode::Fs(FsErrorKind::NotPermitted),
                    format!("{fid} was not set aside for this client"),
                ));
            }
        }
        let creds = r.creds.clone();
        let audited = self.audited(&r.mutation);
        if audited.is_some() {
            self.audit_writes(true)?;
        }
        let out = self.reint(r, Self::node_of(req)).await;
        if let Some(what) = audited {
            let made = out
                .as_ref()
                .ok()
                .and_then(|r| r.inode.as_ref().map(|i| i.fid));
            self.record(req, &creds, what, made, &out);
        }
        out
    }

    /// Sets inode numbers aside for a client's asynchronous creates: taken from the namespace
    /// and committed, then recorded as the client's, before the answer.
    async fn reserve(&self, r: MdsReserve) -> Result<Vec<u8>, RemoteError> {
        if !self.clients.holds(r.client) {
            return Err(RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "inode numbers are set aside for clients that joined (MDS_CONNECT)",
            ));
        }
        let count = r.count.clamp(1, MAX_RESERVE);
        let done = self
            .store
            .apply(Mutation::ReserveInodes { count }, Creds::root())
            .await
            .map_err(store_error)?;
        let first = done.reserved.ok_or_else(|| {
            RemoteError::new(StatusCode::Io, "the reservation took no inode numbers")
        })?;
        self.clients
            .reserved
            .give(r.client, first, first + count, |c| self.clients.holds(c))
            .await
            .map_err(|e| RemoteError::new(StatusCode::Io, e.to_string()))?;
        reply::<MdsReserve>(&MdsReserved {
            first: proto::Fid::new(proto::fid::INODE_SEQ, first, 0),
            count,
        })
    }

    async fn reint(
        &self,
        mut r: MdsReint,
        node: Option<std::net::IpAddr>,
    ) -> Result<MdsReintReply, RemoteError> {
        // A stale copy is declared in sync only by a resync that held the file alone from
        // before it copied: a writer open meanwhile (or opened and closed again) wrote only the
        // copies in sync, and the cleared copy would lack its acknowledged writes.
        if let Mutation::MirrorState {
            fid, stale: false, ..
        } = &r.mutation
        {
            let alone = r.open.is_some_and(|h| {
                self.alloc.open.alone_since(*fid, h) && self.may_write_through(*fid, h)
            });
            if !alone {
                return Err(RemoteError::new(
                    StatusCode::Fs(FsErrorKind::WouldBlock),
                    format!(
                        "{fid}: another handle opened the file during the resync; its writes may \
                         be missing from the new copy, which stays stale (resync again once the \
                         file is closed)"
                    ),
                ));
            }
        }
        // A change of size or times through a handle opened for writing needs no permission
        // now: the open was the check (ftruncate of a file created with mode 0). Times are
        // now, or the mtime the writer's page cache kept for its writes (never an atime of its
        // choosing). A handle opened only for reading allows nothing more than the caller's
        // identity does.
        let by_handle = match (&r.mutation, r.open) {
            (Mutation::GrowSize { fid, .. }, Some(h))
            | (Mutation::WriteMdt { fid, .. }, Some(h))
            | (Mutation::MirrorState { fid, .. }, Some(h))
            | (Mutation::PlaceMirror { fid, .. }, Some(h)) => self.may_write_through(*fid, h),
            (Mutation::Setattr { fid, attr }, Some(h)) => {
                let only_size_and_times = attr.mode.is_none()
                    && attr.uid.is_none()
                    && attr.gid.is_none()
                    && (attr.times_now || attr.atime.is_none());
                only_size_and_times && self.may_write_through(*fid, h)
            }
            _ => false,
        };
        if by_handle {
            r.creds = Creds::root();
        }
        // Only a create (`O_CREAT`) counts an open; a handle on a size or times change names
        // the open that allows it, and on any other change it means nothing.
        let creates = matches!(
            r.mutation,
            Mutation::Create { .. } | Mutation::CreateAt { .. } | Mutation::CreateUnnamed { .. }
        );
        let opens = r.open.filter(|_| creates);

        let creds = r.creds.clone();
        let client = r.req.map(|q| q.client);
        let mut stamp: (u64, Option<Vec<u8>>) = (0, None);
        let mut changed = vec![];
        let mut after = vec![];
        let decided = self
            .store
            .decide(&r.mutation, &r.creds, r.req, r.acked)
            .await;
        let (inode, created) = match decided.map_err(store_error)? {
            Decision::Replied(done) => {
                // The first attempt counted its open, if it asked for one (counting the same
                // handle again changes nothing).
                let size_gen = done
                    .inode
                    .as_ref()
                    .map_or(0, |i| self.store.size_gen(i.fid));
                // The creator's rights again only for a resent create of the caller's own
                // file: a request number does not say what the first request was.
                let grant = match (opens, done.inode.as_ref()) {
                    (Some(h), Some(i)) if i.kind == Kind::File => {
                        let mine = i.uid == creds.uid;
                        let allowed = Granter::rights(i, &creds, mine);
                        let rights = self.alloc.open.rights(i.fid, h).unwrap_or(0) | allowed;
                        Some(self.granter.grant_rights(i, rights))
                    }
                    _ => None,
                };
                return Ok(MdsReintReply {
                    inode: done.inode,
                    created: true,
                    size_gen,
                    grant,
                    transno: 0,
                    committed: self.store.committed(),
                    instance: self.instance,
                    ticket: vec![],
                    leased: false,
                    changed: vec![],
                    after: vec![],
                });
            }
            Decision::Opens(inode) => (Some(inode), false),
            Decision::Applies => {
                let mut m = r.mutation;
                // Only a create answered ahead is stamped with the client's time.
                let time = r.time.filter(|_| matches!(m, Mutation::CreateAt { .. }));
                let objects = self.prepare(&mut m).await?;
                // Only a client in the table is answered before the change is durable: only
                // its changes are waited for after a restart.
                let behind = r.behind && r.req.is_some_and(|q| self.clients.holds(q.client));
                let done = self
                    .apply(m, r.creds, r.req, r.size_gen, objects, behind, time)
                    .await?;
                stamp = (done.transno, done.ticket);
                changed = done.touched;
                after = done.after;
                (done.applied.inode, true)
            }
        };
        let mut grant = None;
        if let Some(handle) = opens {
            if let Some(i) = inode.as_ref().filter(|i| i.kind == Kind::File) {
                // The creator may use what it made whatever its mode; an existing file opened
                // by `O_CREAT` gets what the caller's identity allows, and is not opened when
                // that is nothing.
                let allowed = Granter::rights(i, &creds, created);
                if allowed == 0 {
                    return Err(RemoteError::new(
                        StatusCode::Fs(FsErrorKind::AccessDenied),
                        format!("permission denied on {}", i.fid),
                    ));
                }
                let rights = self.count_open(i.fid, handle, allowed, node)?;
                grant = Some(self.granter.grant_rights(i, rights));
            }
        }
        let size_gen = inode.as_ref().map_or(0, |i| self.store.size_gen(i.fid));
        let ticket = match (stamp.1, client) {
            (Some(t), Some(c)) => self.seal(c, t),
            _ => vec![],
        };
        // The inode returned, leased to its changer and read again after the grant.
        let mut leased = false;
        let mut inode = inode;
        if let (Some(c), Some(i)) = (self.lessee(client.filter(|_| r.lease)), &inode) {
            if self.leases.grant(c, &[i.fid]) {
                if let Ok(fresh) = self.store.read(|ns| ns.inode(i.fid).cloned()) {
                    inode = Some(fresh);
                    leased = true;
                }
            }
        }
        Ok(MdsReintReply {
            inode,
            created,
            size_gen,
            grant,
            transno: stamp.0,
            committed: self.store.committed(),
            instance: self.instance,
            ticket,
            leased,
            changed,
            after,
        })
    }

    /// A ticket for `client` to replay: the encoded ticket ([`crate::journal::encode_ticket`]),
    /// then its seal (none when authentication is off: every peer is trusted then).
    fn seal(&self, client: u128, mut out: Vec<u8>) -> Vec<u8> {
        if let Some(key) = &self.granter.key {
            let seal = key.seal(&ticket_context(client), &out);
            out.extend_from_slice(&seal);
        }
        out
    }

    /// The ticket `client` sent back, if the MDS sealed it for that client.
    fn unseal(&self, client: u128, raw: &[u8]) -> Result<Ticket, RemoteError> {
        let forged = || {
            tracing::warn!(
                client = format!("{client:032x}"),
                "a replay ticket failed its seal"
            );
            RemoteError::new(
                StatusCode::Fs(FsErrorKind::NotPermitted),
                "the replay ticket is not one this filesystem sealed for this client",
            )
        };
        let body = match &self.granter.key {
            Some(key) => {
                let cut = raw.len().checked_sub(32).ok_or_else(forged)?;
                let (body, seal) = raw.split_at(cut);
                if !key.unseal(&ticket_context(client), body, seal) {
                    return Err(forged());
                }
                body
            }
            None => raw,
        };
        postcard::from_bytes(body).map_err(|e| {
            RemoteError::new(
                StatusCode::Fs(FsErrorKind::Invalid),
                format!("a replay ticket that does not decode: {e}"),
            )
        })
    }

    /// A client counts again, after a restart, the files it holds open: each one the
    /// namespace still has, by a name or by objects kept for removal, is counted.
    fn reopen(&self, r: MdsReopen, node: Option<std::net::IpAddr>) -> Result<Vec<u8>, RemoteError> {
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
    fn count_open(
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

    /// The node a client's request comes from (its open handles are bounded per node);
    /// `None` for servers.
    fn node_of(req: &Incoming) -> Option<std::net::IpAddr> {
        match (&req.from, req.role) {
            (proto::Nid::Tcp(a), lnet::auth::Role::Client) => Some(a.ip()),
            _ => None,
        }
    }

    /// Whether `handle` is open on `fid` with the right to write.
    fn may_write_through(&self, fid: proto::Fid, handle: OpenHandle) -> bool {
        self.alloc
            .open
            .rights(fid, handle)
            .is_some_and(|r| r & proto::capa::WRITE != 0)
    }

    /// Applies a mutation; objects allocated for it that it did not use (an existing file was
    /// opened, or it failed) go back to their pools.
    #[allow(clippy::too_many_arguments)]
    async fn apply(
        &self,
        m: Mutation,
        creds: Creds,
        req: Option<ReqId>,
        size_gen: Option<u64>,
        objects: Vec<StripeObject>,
        behind: bool,
        time: Option<proto::md::Time>,
    ) -> Result<crate::store::Done, RemoteError> {
        // Other clients' leases on what the change touches are recalled first; the check is
        // made again as it applies, and the change goes round again if one was granted since.
        let except = req.map(|q| q.client);
        let kind = m.name();
        let mut result = loop {
            let touched = self.store.read(|ns| ns.touched(&m));
            let _recall = self.leases.recall(&touched, except).await;
            let clear = |fids: &[proto::Fid]| self.leases.clear(fids, except);
            let after = |f: &proto::Fid| except.is_some_and(|c| self.leases.holds(c, *f));
            match self.store.apply_clear(
                m.clone(),
                creds.clone(),
                req,
                size_gen,
                time,
                &clear,
                &after,
            ) {
                Err(StoreError::Leased) => continue,
                other => break other,
            }
        };
        if let Ok(done) = &mut result {
            if !behind || done.ticket.is_none() {
                // Answered once durable: nothing to replay.
                done.ticket = None;
                if let Err(e) = self.store.wait_committed(done.transno).await {
                    result = Err(e);
                }
            }
        }
        if let (Some(metrics), Ok(_)) = (&self.metrics, &result) {
            metrics.applied(kind);
        }
        let used = match &result {
            Ok(d) => d
                .applied
                .inode
                .as_ref()
                .and_then(|i| i.layout.as_ref())
                .map(objects_of)
                .unwrap_or_default(),
            Err(_) => vec![],
        };
        let unused: Vec<StripeObject> = objects.into_iter().filter(|o| !used.contains(o)).collect();
        self.alloc.give_back(&unused);
        result.map_err(store_error)
    }
}

/// An inode as `creds` may see it: its xattrs only for whom may read the file (as
/// getxattr needs), and whether it is whole (a cut one is not leased: the client's cache
/// serves all its users).
fn shown(mut inode: Inode, creds: &Creds) -> (Inode, bool) {
    if inode.xattrs.is_empty() || inode.permits(creds, 4) {
        return (inode, true);
    }
    inode.xattrs.clear();
    (inode, false)
}

/// The layout of a file that names none: one stripe of 4 MiB, as in Lustre.
pub fn default_layout() -> Layout {
    Layout {
        generation: 1,
        components: vec![Component::raid0(StripeCount::Count(1), DEFAULT_STRIPE_SIZE)],
    }
}

fn objects_of(l: &Layout) -> Vec<StripeObject> {
    l.components
        .iter()
        .flat_map(|c| c.objects.iter().copied())
        .collect()
}

impl Service for MdsService {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        _bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>> {
        Box::pin(async move { self.dispatch(req).await })
    }

    /// A sixteenth of the slots (at least 8): a client's library keeps far fewer requests in
    /// flight on one connection (its changes go in batches).
    fn share_per_connection(&self, slots: usize) -> Option<usize> {
        Some((slots / 16).max(8))
    }

    fn status(&self) -> proto::stats::ServiceStatus {
        proto::stats::ServiceStatus {
            kind: "mds".into(),
            targets: vec![],
            journal: Some(proto::stats::JournalStatus {
                applied: self.store.last_applied(),
                committed: self.store.committed(),
                failed: self.store.failed(),
            }),
            clients: self.clients.count() as u64,
            inodes: self.store.read(|ns| ns.len()) as u64,
        }
    }
}
