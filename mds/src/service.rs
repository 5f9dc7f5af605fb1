//! The metadata service as the network sees it: the registry of targets and the namespace.
//!
//! Callers state their own uid and groups, as NFS's AUTH_SYS and Lustre without Kerberos do:
//! the MDS trusts the client node to tell the truth about its users.

use std::sync::Arc;

use lnet::service::{reply, BoxFuture, BulkPeer, Incoming, Service};
use proto::md::*;
use proto::msg::opcodes;
use proto::registry::*;
use proto::{RemoteError, StatusCode};

use crate::namespace::NsError;
use crate::registry::{Registry, RegistryError};
use crate::store::{Store, StoreError};

pub struct MdsService {
    registry: Registry,
    store: Store,
}

fn ns_error(e: NsError) -> RemoteError {
    RemoteError::new(StatusCode::Posix(e.errno), e.what)
}

fn store_error(e: StoreError) -> RemoteError {
    match e {
        StoreError::Namespace(e) => ns_error(e),
        other => RemoteError::new(StatusCode::Io, other.to_string()),
    }
}

impl MdsService {
    pub fn new(registry: Registry, store: Store) -> Arc<Self> {
        Arc::new(MdsService { registry, store })
    }

    async fn dispatch(&self, req: Incoming) -> Result<Vec<u8>, RemoteError> {
        match req.opcode {
            opcodes::MDS_REGISTER_TARGETS => {
                let r: RegisterTargets = req.decode()?;
                let indices = self.registry.register(&r.oss, &r.targets).map_err(|e| {
                    let code = match e {
                        RegistryError::IndexTaken { .. } => StatusCode::Exists,
                        RegistryError::Full => StatusCode::NoSpace,
                        _ => StatusCode::Io,
                    };
                    RemoteError::new(code, e.to_string())
                })?;
                reply::<RegisterTargets>(&Registered { indices })
            }
            opcodes::MDS_HEARTBEAT => {
                let r: Heartbeat = req.decode()?;
                self.registry.heartbeat(&r.oss, &r.targets);
                reply::<Heartbeat>(&HeartbeatAck {})
            }
            opcodes::MDS_LIST_TARGETS => {
                let _: ListTargets = req.decode()?;
                reply::<ListTargets>(&TargetList {
                    targets: self.registry.list(),
                })
            }
            opcodes::MDS_REINT => {
                let r: MdsReint = req.decode()?;
                let applied = self
                    .store
                    .apply(r.mutation, r.creds)
                    .await
                    .map_err(store_error)?;
                reply::<MdsReint>(&MdsReintReply {
                    inode: applied.inode,
                })
            }
            opcodes::MDS_LOOKUP => {
                let r: MdsLookup = req.decode()?;
                let inode = self
                    .store
                    .read(|ns| ns.lookup(r.parent, &r.name, &r.creds).cloned())
                    .map_err(ns_error)?;
                reply::<MdsLookup>(&MdsInode { inode })
            }
            opcodes::MDS_GETATTR => {
                let r: MdsGetattr = req.decode()?;
                let inode = self
                    .store
                    .read(|ns| ns.inode(r.fid).cloned())
                    .map_err(ns_error)?;
                reply::<MdsGetattr>(&MdsInode { inode })
            }
            opcodes::MDS_READDIR => {
                let r: MdsReaddir = req.decode()?;
                let max = r.max.clamp(1, MAX_READDIR) as usize;
                let after = (!r.after.is_empty()).then_some(&r.after[..]);
                let entries = self
                    .store
                    .read(|ns| ns.readdir(r.dir, after, max + 1, &r.creds))
                    .map_err(ns_error)?;
                let end = entries.len() <= max;
                let entries = entries
                    .into_iter()
                    .take(max)
                    .map(|(name, fid, kind)| DirEntry { name, fid, kind })
                    .collect();
                reply::<MdsReaddir>(&MdsDirPage { entries, end })
            }
            other => Err(RemoteError::new(
                StatusCode::NoService,
                format!("the MDS does not serve {other:?}"),
            )),
        }
    }
}

impl Service for MdsService {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        _bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>> {
        Box::pin(async move { self.dispatch(req).await })
    }
}
