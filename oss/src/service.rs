//! The storage service: OST requests from the network, carried out on the targets this server
//! holds. Data of a write is pulled from the client and its checksum verified before the target
//! sees a byte; data of a read is put straight from the target's buffer into the client's region.

use std::collections::BTreeMap;
use std::sync::Arc;

use lnet::auth::capability::{CapabilityKey, READ, WRITE};
use lnet::auth::Role;
use lnet::service::{reply, BoxFuture, BulkPeer, Incoming, Service};
use lnet::NetError;
use proto::msg::opcodes;
use proto::ost::*;
use proto::{BulkDesc, RemoteError, StatusCode};

use crate::target::Target;

/// Serves OST requests for a set of targets, by index.
pub struct OssService {
    targets: BTreeMap<u32, Arc<Target>>,
    /// Checks clients' capabilities; `None` when authentication is off.
    capability: Option<CapabilityKey>,
    metrics: Option<Arc<crate::metrics::OssMetrics>>,
}

impl OssService {
    pub fn new(
        targets: impl IntoIterator<Item = Arc<Target>>,
        capability: Option<CapabilityKey>,
        metrics: Option<Arc<crate::metrics::OssMetrics>>,
    ) -> Arc<Self> {
        Arc::new(OssService {
            targets: targets.into_iter().map(|t| (t.index(), t)).collect(),
            capability,
            metrics,
        })
    }

    /// Object I/O from a client needs a capability of the MDS for that very object, with the
    /// rights asked for, not expired. Servers hold the key that signs them and need none.
    fn authorize(
        &self,
        req: &Incoming,
        capa: Option<&proto::capa::Capability>,
        target: u32,
        fid: proto::Fid,
        need: u8,
    ) -> Result<(), RemoteError> {
        let Some(key) = &self.capability else {
            return Ok(());
        };
        if req.role == Role::Server {
            return Ok(());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        key.check(capa, target, fid, need, now).map_err(|e| {
            tracing::debug!(peer = %req.from, %fid, target, error = %e, "object access refused");
            RemoteError::new(
                StatusCode::Fs(proto::FsErrorKind::AccessDenied),
                format!("object {fid} on target {target}: {e}"),
            )
        })
    }

    /// Creating and destroying objects is the MDS's business: a client may not.
    fn server_only(&self, req: &Incoming) -> Result<(), RemoteError> {
        if req.role == Role::Server {
            return Ok(());
        }
        tracing::warn!(peer = %req.from, opcode = ?req.opcode, "a client asked for a server's operation");
        Err(RemoteError::new(
            StatusCode::Fs(proto::FsErrorKind::NotPermitted),
            format!("{:?} is for servers only", req.opcode),
        ))
    }

    fn target(&self, index: u32) -> Result<&Arc<Target>, RemoteError> {
        self.targets.get(&index).ok_or_else(|| {
            RemoteError::new(
                StatusCode::NotFound,
                format!("this server has no target {index}"),
            )
        })
    }

    fn stage(&self, stage: &'static str, since: std::time::Instant) {
        if let Some(m) = &self.metrics {
            m.stage(stage, since);
        }
    }

    /// Data pulled from the client, its checksum verified before the target sees a byte.
    async fn write(&self, r: OstWrite, bulk: Arc<dyn BulkPeer>) -> Result<Vec<u8>, RemoteError> {
        let target = self.target(r.target)?;
        // A descriptor with a crc32c is checked against it on arrival (end to end); one
        // without (GPU memory the client cannot read) is checksummed here, on receipt.
        let t = std::time::Instant::now();
        let data = bulk.get(&r.desc).await.map_err(bulk_error)?;
        self.stage("bulk_get", t);
        let t = std::time::Instant::now();
        let size = target.write(r.fid, r.offset, &data, r.sync, r.stamp).await;
        self.stage("write_disk", t);
        let size = size?;
        if let Some(m) = &self.metrics {
            m.written(r.target, data.len() as u64);
        }
        reply::<OstWrite>(&OstWritten {
            size,
            epoch: target.epoch(),
        })
    }

    /// Data put from the target's buffer straight into the client's region.
    async fn read(&self, r: OstRead, bulk: Arc<dyn BulkPeer>) -> Result<Vec<u8>, RemoteError> {
        let target = self.target(r.target)?;
        let t = std::time::Instant::now();
        let data = target.read(r.fid, r.offset, u64::from(r.desc.len)).await;
        self.stage("read_disk", t);
        let mut data = data?;
        let size = target.size(r.fid).await?;
        // Zeros at the end (holes, mostly) are not sent: the reply says how many bytes were
        // placed, and a client takes the rest of what it asked for as zeros.
        data.truncate(crate::object::without_trailing_zeros(&data));
        let bytes = data.len() as u32;
        // The client checks the bytes in its memory against this, end to end, unless the
        // connection's tag (checked on the same bytes) already does.
        let crc32c = (!bulk.sealed()).then(|| crc32c::crc32c(&data));
        if bytes > 0 {
            let desc = BulkDesc {
                len: bytes,
                ..r.desc
            };
            let t = std::time::Instant::now();
            let put = bulk.put(&desc, data).await;
            self.stage("bulk_put", t);
            put.map_err(bulk_error)?;
        }
        if let Some(m) = &self.metrics {
            m.read(r.target, u64::from(bytes));
        }
        reply::<OstRead>(&OstReadDone {
            bytes,
            size,
            crc32c,
        })
    }

    async fn dispatch(
        &self,
        req: Incoming,
        bulk: Arc<dyn BulkPeer>,
    ) -> Result<Vec<u8>, RemoteError> {
        match req.opcode {
            opcodes::OST_PRECREATE => {
                self.server_only(&req)?;
                let r: OstPrecreate = req.decode()?;
                let first = self.target(r.target)?.precreate_for(r.mdt, r.count).await?;
                reply::<OstPrecreate>(&OstPrecreated {
                    first,
                    count: r.count,
                })
            }
            opcodes::OST_WRITE => {
                let r: OstWrite = req.decode()?;
                self.authorize(&req, r.capa.as_ref(), r.target, r.fid, WRITE)?;
                self.write(r, bulk).await
            }
            opcodes::OST_READ => {
                let r: OstRead = req.decode()?;
                self.authorize(&req, r.capa.as_ref(), r.target, r.fid, READ)?;
                self.read(r, bulk).await
            }
            opcodes::OST_TRUNCATE => {
                let r: OstTruncate = req.decode()?;
                self.authorize(&req, r.capa.as_ref(), r.target, r.fid, WRITE)?;
                self.target(r.target)?
                    .truncate(r.fid, r.size, r.stamp)
                    .await?;
                reply::<OstTruncate>(&OstDone {})
            }
            opcodes::OST_PUNCH => {
                let r: OstPunch = req.decode()?;
                self.authorize(&req, r.capa.as_ref(), r.target, r.fid, WRITE)?;
                if r.len > MAX_PUNCH {
                    return Err(RemoteError::new(
                        StatusCode::Invalid,
                        format!("a punch covers at most {MAX_PUNCH} bytes, not {}", r.len),
                    ));
                }
                let target = self.target(r.target)?;
                target.punch(r.fid, r.offset, r.len, r.stamp).await?;
                reply::<OstPunch>(&OstAck {
                    epoch: target.epoch(),
                })
            }
            opcodes::OST_DESTROY => {
                self.server_only(&req)?;
                let r: OstDestroy = req.decode()?;
                self.target(r.target)?.destroy(r.fid).await?;
                reply::<OstDestroy>(&OstDone {})
            }
            opcodes::OST_GETATTR => {
                let r: OstGetattr = req.decode()?;
                self.authorize(&req, r.capa.as_ref(), r.target, r.fid, READ)?;
                let size = self.target(r.target)?.size(r.fid).await?;
                reply::<OstGetattr>(&OstAttr { size })
            }
            opcodes::OST_SYNC => {
                let r: OstSync = req.decode()?;
                // Syncing changes nothing: a handle open for reading may sync (fsync(2)).
                self.authorize(&req, r.capa.as_ref(), r.target, r.fid, READ)?;
                let target = self.target(r.target)?;
                let t = std::time::Instant::now();
                let synced = target.sync(r.fid).await;
                self.stage("sync", t);
                synced?;
                reply::<OstSync>(&OstAck {
                    epoch: target.epoch(),
                })
            }
            opcodes::OST_STATFS => {
                let r: OstStatfs = req.decode()?;
                let space = self.target(r.target)?.space()?;
                reply::<OstStatfs>(&TargetSpace {
                    index: r.target,
                    total: space.total,
                    free: space.free,
                })
            }
            opcodes::OST_DESTROY_MANY => {
                self.server_only(&req)?;
                let r: OstDestroyMany = req.decode()?;
                if r.fids.len() > MAX_DESTROY_MANY {
                    return Err(RemoteError::new(
                        StatusCode::Invalid,
                        format!(
                            "a destroy names at most {MAX_DESTROY_MANY} objects, not {}",
                            r.fids.len()
                        ),
                    ));
                }
                let missing = self.target(r.target)?.destroy_many(&r.fids).await?;
                reply::<OstDestroyMany>(&OstDestroyedMany { missing })
            }
            opcodes::OST_DESTROY_ABOVE => {
                self.server_only(&req)?;
                let r: OstDestroyAbove = req.decode()?;
                let destroyed = self
                    .target(r.target)?
                    .destroy_above(r.mdt, r.keep_up_to, r.run, r.fs)
                    .await?;
                reply::<OstDestroyAbove>(&OstDestroyedAbove { destroyed })
            }
            other => Err(RemoteError::new(
                StatusCode::NoService,
                format!("a storage server does not serve {other:?}"),
            )),
        }
    }
}

fn bulk_error(e: NetError) -> RemoteError {
    let code = match e {
        NetError::Checksum { .. } => StatusCode::Checksum,
        _ => StatusCode::Bulk,
    };
    RemoteError::new(code, e.to_string())
}

impl Service for OssService {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>> {
        Box::pin(async move { self.dispatch(req, bulk).await })
    }

    fn status(&self) -> proto::stats::ServiceStatus {
        let targets = self
            .targets
            .values()
            .map(|t| {
                let mut s = proto::stats::TargetStatus {
                    index: t.index(),
                    ..Default::default()
                };
                match t.space() {
                    Ok(space) => (s.total, s.free) = (space.total, space.free),
                    Err(e) => s.error = Some(e.to_string()),
                }
                if let Some(m) = &self.metrics {
                    (s.read_bytes, s.write_bytes, s.reads, s.writes) = m.counts(t.index());
                }
                s
            })
            .collect();
        proto::stats::ServiceStatus {
            kind: "oss".into(),
            targets,
            ..Default::default()
        }
    }
}

/// A service bound before its targets are known: requests are answered Busy until
/// [`ServiceSlot::set`] gives it the real one (a server binds first so that it can tell the
/// MDS its address, and learns its targets' indices from the answer).
pub(crate) struct ServiceSlot(std::sync::OnceLock<Arc<OssService>>);

impl ServiceSlot {
    pub(crate) fn new() -> Arc<ServiceSlot> {
        Arc::new(ServiceSlot(std::sync::OnceLock::new()))
    }

    pub(crate) fn set(&self, s: Arc<OssService>) {
        let _ = self.0.set(s);
    }
}

impl Service for ServiceSlot {
    fn handle(
        self: Arc<Self>,
        req: Incoming,
        bulk: Arc<dyn BulkPeer>,
    ) -> BoxFuture<'static, Result<Vec<u8>, RemoteError>> {
        match self.0.get() {
            Some(s) => s.clone().handle(req, bulk),
            None => {
                Box::pin(async { Err(RemoteError::new(StatusCode::Busy, "targets are starting")) })
            }
        }
    }

    fn status(&self) -> proto::stats::ServiceStatus {
        match self.0.get() {
            Some(s) => s.status(),
            None => proto::stats::ServiceStatus {
                kind: "oss".into(),
                ..Default::default()
            },
        }
    }
}
