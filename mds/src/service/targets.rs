//! Storage targets: registration (servers only), heartbeats, the list clients stripe over.

use super::*;

impl MdsService {
    /// A storage server's targets (`MDS_REGISTER_TARGETS`, servers only).
    pub(super) fn serve_register_targets(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        self.server_only(req)?;
        self.register(req.decode()?)
    }

    /// A storage server's targets, registered: their indices (durable before the answer).
    pub(super) fn register(&self, r: RegisterTargets) -> Result<Vec<u8>, RemoteError> {
        self.alloc.peer_rails(&r.oss, &r.rails);
        let indices = self
            .registry
            .register(&r.oss, &r.rails, &r.targets)
            .map_err(|e| {
                let code = match e {
                    RegistryError::IndexTaken { .. } => StatusCode::Exists,
                    RegistryError::Full => StatusCode::NoSpace,
                    RegistryError::OtherFilesystem { .. }
                    | RegistryError::UnknownIndex { .. }
                    | RegistryError::NotFromMdt0 { .. } => {
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

    /// A storage server's heartbeat (`MDS_HEARTBEAT`, servers only).
    pub(super) fn serve_heartbeat(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        self.server_only(req)?;
        let r: Heartbeat = req.decode()?;
        self.registry.heartbeat(&r.oss, &r.rails, &r.targets);
        self.alloc.peer_rails(&r.oss, &r.rails);
        reply::<Heartbeat>(&HeartbeatAck {
            mdts: self.registry.mdts(),
        })
    }

    /// Another MDT's MDS says where it serves (`MDS_REGISTER_MDT`, servers only, on MDT0).
    pub(super) fn serve_register_mdt(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        self.server_only(req)?;
        let r: RegisterMdt = req.decode()?;
        self.registry
            .register_mdt(r.mdt, r.fs, &r.nid, &r.rails)
            .map(|()| self.registry.mdt_holds(r.mdt, r.inodes))
            .map_err(|e| {
                let code = match e {
                    RegistryError::BadMdt(_) => StatusCode::Invalid,
                    RegistryError::Io { .. } | RegistryError::Damaged { .. } => StatusCode::Io,
                    _ => {
                        tracing::error!(mdt = r.mdt, nid = %r.nid, error = %e, "refused an MDT");
                        StatusCode::Refused
                    }
                };
                RemoteError::new(code, e.to_string())
            })?;
        reply::<RegisterMdt>(&MdtRegistered {})
    }

    /// The filesystem's other MDTs (`MDS_LIST_MDTS`; MDT0 knows them, another MDT lists
    /// none).
    pub(super) fn serve_list_mdts(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let _: ListMdts = req.decode()?;
        reply::<ListMdts>(&MdtList {
            mdts: self.registry.mdts(),
        })
    }

    /// The targets and whether each takes new stripes (`MDS_LIST_TARGETS`).
    pub(super) fn serve_list_targets(&self, req: &Incoming) -> Result<Vec<u8>, RemoteError> {
        let _: ListTargets = req.decode()?;
        let mut targets = self.registry.list();
        self.alloc.mark_takes_stripes(&mut targets);
        reply::<ListTargets>(&TargetList { targets })
    }
}
