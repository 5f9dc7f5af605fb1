//! The metadata service as the network sees it.

use std::sync::Arc;

use lnet::service::{reply, BoxFuture, BulkPeer, Incoming, Service};
use proto::msg::opcodes;
use proto::registry::*;
use proto::{RemoteError, StatusCode};

use crate::registry::{Registry, RegistryError};

pub struct MdsService {
    registry: Registry,
}

impl MdsService {
    pub fn new(registry: Registry) -> Arc<Self> {
        Arc::new(MdsService { registry })
    }

    fn dispatch(&self, req: Incoming) -> Result<Vec<u8>, RemoteError> {
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
        Box::pin(async move { self.dispatch(req) })
    }
}
