//! One node on the simulated fabric: its calls out, its server, its registered memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use proto::frame::{decode_frame, encode_frame, FrameKind, Header};
use proto::{BulkDesc, Nid, Opcode, RemoteError};
use tokio::sync::oneshot;

use super::{BulkFault, FabricInner};
use crate::error::NetError;
use crate::region::RegionTable;
use crate::service::{
    busy, verify_desc_crc, BoxFuture, BulkPeer, Dispatcher, Incoming, Service, DEFAULT_QUEUE_SLOTS,
};
use crate::transport::{check_body, error_body, reply_result, Transport};

type Reply = oneshot::Sender<Result<Vec<u8>, NetError>>;

struct PendingCall {
    target: String,
    reply: Reply,
    /// The memory the server may move bytes with while serving this call.
    bulk: Option<proto::bulk::BulkGrant>,
}

pub(crate) struct NodeInner {
    nid: Nid,
    name: String,
    generation: u64,
    regions: Arc<RegionTable>,
    dispatcher: Option<Dispatcher>,
    pending: Mutex<HashMap<u64, PendingCall>>,
    next_xid: AtomicU64,
    down: AtomicBool,
}

impl NodeInner {
    pub(crate) fn new(
        nid: Nid,
        generation: u64,
        salt: u64,
        service: Option<Arc<dyn Service>>,
    ) -> Arc<Self> {
        let Nid::Sim(name) = &nid else {
            unreachable!("sim nodes are built from sim NIDs")
        };
        Arc::new(NodeInner {
            name: name.clone(),
            nid,
            generation,
            regions: RegionTable::new(salt),
            dispatcher: service.map(|s| Dispatcher::new(s, DEFAULT_QUEUE_SLOTS)),
            pending: Mutex::new(HashMap::new()),
            // Each incarnation numbers its calls apart, so a late reply to the previous one
            // can never complete a call of this one.
            next_xid: AtomicU64::new(generation << 40),
            down: AtomicBool::new(false),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn nid(&self) -> &Nid {
        &self.nid
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn crashed(&self) {
        self.down.store(true, Ordering::Release);
        self.regions.clear();
        for (_, p) in self.pending.lock().drain() {
            let _ = p.reply.send(Err(NetError::NodeDown {
                peer: self.nid.clone(),
            }));
        }
    }

    /// Fails the calls waiting on `name`, as a reset connection would.
    pub(crate) fn peer_crashed(&self, name: &str) {
        let mut pending = self.pending.lock();
        let dead: Vec<u64> = pending
            .iter()
            .filter(|(_, p)| p.target == name)
            .map(|(x, _)| *x)
            .collect();
        for xid in dead {
            if let Some(p) = pending.remove(&xid) {
                let _ = p.reply.send(Err(NetError::NodeDown {
                    peer: Nid::Sim(name.to_owned()),
                }));
            }
        }
    }
}

/// Sends a frame across the fabric; each copy the fabric lets through lands on whatever
/// incarnation of `to` is running when it arrives.
fn send(
    fabric: &Arc<FabricInner>,
    from: &NodeInner,
    to: &str,
    kind: FrameKind,
    xid: u64,
    frame: Vec<u8>,
) -> Result<(), NetError> {
    let label = match kind {
        FrameKind::Request => "request",
        _ => "reply",
    };
    let route = fabric.route(from, to, label, xid, frame.len() as u64)?;
    let frame = Bytes::from(frame);
    for at in route.arrivals {
        let (fabric, from, to, frame) = (
            fabric.clone(),
            from.name.clone(),
            to.to_owned(),
            frame.clone(),
        );
        tokio::spawn(async move {
            if at > tokio::time::Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            if let Some(node) = fabric.live(&to) {
                receive(&fabric, &node, from, &frame);
            }
        });
    }
    Ok(())
}

fn receive(fabric: &Arc<FabricInner>, node: &Arc<NodeInner>, from: String, frame: &[u8]) {
    let (header, body) = match decode_frame(frame) {
        Ok(Some(f)) => f,
        other => {
            tracing::warn!(node = %node.nid, ?other, "undecodable frame dropped");
            return;
        }
    };
    match header.kind {
        FrameKind::Request => on_request(fabric, node, from, header, body.to_vec()),
        FrameKind::Reply => {
            let Some(p) = node.pending.lock().remove(&header.xid) else {
                return;
            };
            let _ = p.reply.send(reply_result(
                &Nid::Sim(p.target),
                header.error,
                body.to_vec(),
            ));
        }
        // Bulk moves by direct copy on this fabric; bulk frames never travel on it.
        other => tracing::warn!(node = %node.nid, ?other, "unexpected frame kind dropped"),
    }
}

fn on_request(
    fabric: &Arc<FabricInner>,
    node: &Arc<NodeInner>,
    from: String,
    header: Header,
    body: Vec<u8>,
) {
    let (xid, opcode) = (header.xid, header.opcode);
    let request_job = proto::frame::request_job(&header, body);
    let reply_to = move |out: Result<Vec<u8>, RemoteError>,
                         fabric: &Arc<FabricInner>,
                         node: &NodeInner,
                         to: &str| {
        let mut h = Header::new(FrameKind::Reply, opcode, xid);
        let body = match out {
            Ok(b) => b,
            Err(e) => {
                h.error = true;
                error_body(&e)
            }
        };
        // A crashed server's replies are dropped by the fabric; nothing to do about it here.
        let _ = send(
            fabric,
            node,
            to,
            FrameKind::Reply,
            xid,
            encode_frame(h, &body),
        );
    };
    let (job, body) = match request_job {
        Ok(v) => v,
        Err(e) => {
            let e = RemoteError::new(proto::StatusCode::BadRequest, e.to_string());
            return reply_to(Err(e), fabric, node, &from);
        }
    };
    let admitted = match &node.dispatcher {
        None => {
            let e = RemoteError::new(proto::StatusCode::NoService, "this node serves no requests");
            return reply_to(Err(e), fabric, node, &from);
        }
        Some(d) => match d.admit(opcode, crate::auth::Role::Server) {
            Some(a) => a,
            None => return reply_to(Err(busy()), fabric, node, &from),
        },
    };
    let (fabric, node) = (fabric.clone(), node.clone());
    tokio::spawn(async move {
        let req = Incoming {
            // The fabric is a simulation inside one process: every node is trusted.
            role: crate::auth::Role::Server,
            from: Nid::Sim(from.clone()),
            to: node.nid.clone(),
            opcode,
            xid,
            job,
            body,
        };
        let bulk: Arc<dyn BulkPeer> = Arc::new(SimBulk {
            fabric: fabric.clone(),
            server: node.clone(),
            owner: from.clone(),
            xid,
        });
        let out = admitted.run(req, bulk).await;
        reply_to(out, &fabric, &node, &from);
    });
}

/// A node's handle on the simulated fabric.
#[derive(Clone)]
pub struct SimEndpoint {
    fabric: Arc<FabricInner>,
    node: Arc<NodeInner>,
}

impl SimEndpoint {
    pub(crate) fn new(fabric: Arc<FabricInner>, node: Arc<NodeInner>) -> Self {
        SimEndpoint { fabric, node }
    }

    /// The node's name on the fabric.
    pub fn name(&self) -> &str {
        &self.node.name
    }

    /// Which incarnation of the node this is (1 for the first start).
    pub fn generation(&self) -> u64 {
        self.node.generation
    }

    /// Takes this node off the fabric, as [`super::Fabric::crash`] does (a later start of the
    /// same name is a new incarnation). A node already replaced is left alone.
    pub fn shutdown(&self) {
        let fabric = super::Fabric {
            inner: self.fabric.clone(),
        };
        if fabric.generation(&self.node.name) == Some(self.node.generation) {
            fabric.crash(&self.node.name);
        }
    }
}

impl Transport for SimEndpoint {
    fn nid(&self) -> Nid {
        self.node.nid.clone()
    }

    /// The simulated NIC reaches device memory through the device's DMA engine, unless the
    /// fabric was told to make this node's registrations fail.
    fn register_device(
        &self,
        mem: crate::device::DeviceMemory,
    ) -> Result<crate::Registered<crate::device::DeviceMemory>, NetError> {
        if self.fabric.device_refused(&self.node.name) {
            return Err(NetError::NoDeviceMemory(format!(
                "{}: the NIC refused to register {} bytes of GPU {} memory",
                self.node.nid, mem.len, mem.ordinal
            )));
        }
        Ok(self.node.regions.register_device(mem)?)
    }

    fn regions(&self) -> &Arc<RegionTable> {
        &self.node.regions
    }

    fn call_raw<'a>(
        &'a self,
        peer: &'a Nid,
        opcode: Opcode,
        body: Vec<u8>,
        bulk: Option<proto::bulk::BulkGrant>,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, NetError>> {
        Box::pin(async move {
            let Nid::Sim(to) = peer else {
                return Err(NetError::WrongNetwork {
                    nid: peer.clone(),
                    want: "sim",
                });
            };
            check_body(peer, &body)?;
            if self.node.down.load(Ordering::Acquire) {
                return Err(NetError::NodeDown {
                    peer: self.node.nid.clone(),
                });
            }
            let xid = self.node.next_xid.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            self.node.pending.lock().insert(
                xid,
                PendingCall {
                    target: to.clone(),
                    reply: tx,
                    bulk,
                },
            );
            let job = crate::job::current(None);
            let frame = proto::frame::encode_request(opcode, xid, job.as_ref(), &body);
            if let Err(e) = send(&self.fabric, &self.node, to, FrameKind::Request, xid, frame) {
                self.node.pending.lock().remove(&xid);
                return Err(e);
            }
            let out = match tokio::time::timeout(deadline, rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err(NetError::NodeDown {
                    peer: self.node.nid.clone(),
                }),
                Err(_) => Err(NetError::Timeout {
                    peer: peer.clone(),
                    after: deadline,
                }),
            };
            self.node.pending.lock().remove(&xid);
            out
        })
    }
}

/// A server's bulk channel to the owner of one request's memory.
#[derive(Clone)]
struct SimBulk {
    fabric: Arc<FabricInner>,
    server: Arc<NodeInner>,
    owner: String,
    xid: u64,
}

impl SimBulk {
    /// Waits out the transfer on the link it crosses (owner to server for a get, server to
    /// owner for a put), then returns the owner's live node.
    async fn transfer(&self, owner_sends: bool, bytes: u64) -> Result<Arc<NodeInner>, NetError> {
        let arrive = if owner_sends {
            let owner = self.fabric.live(&self.owner).ok_or_else(|| self.down())?;
            self.fabric
                .route_bulk(&owner, self.server.name(), "bulk-get", self.xid, bytes)?
        } else {
            self.fabric
                .route_bulk(&self.server, &self.owner, "bulk-put", self.xid, bytes)?
        };
        if arrive > tokio::time::Instant::now() {
            tokio::time::sleep_until(arrive).await;
        }
        // The owner may have crashed while the bytes were on the wire.
        self.fabric.live(&self.owner).ok_or_else(|| self.down())
    }

    /// Refuses a transfer the owner's call did not grant this server.
    fn granted(&self, owner: &NodeInner, desc: &BulkDesc, write: bool) -> Result<(), NetError> {
        let ok = owner.pending.lock().get(&self.xid).is_some_and(|p| {
            p.target == *self.server.name()
                && p.bulk
                    .is_some_and(|g| g.covers(desc.key, desc.offset, u64::from(desc.len), write))
        });
        if ok {
            return Ok(());
        }
        Err(NetError::Region(crate::RegionError::NotGranted {
            key: desc.key,
            offset: desc.offset,
            len: u64::from(desc.len),
        }))
    }

    fn down(&self) -> NetError {
        NetError::NodeDown {
            peer: Nid::Sim(self.owner.clone()),
        }
    }
}

impl BulkPeer for SimBulk {
    fn put(&self, desc: &BulkDesc, data: Bytes) -> BoxFuture<'static, Result<(), NetError>> {
        let this = self.clone();
        let desc = desc.clone();
        Box::pin(async move {
            if data.len() != desc.len as usize {
                return Err(NetError::BulkLength {
                    expected: desc.len,
                    got: data.len(),
                });
            }
            let owner = this.transfer(false, data.len() as u64).await?;
            this.granted(&owner, &desc, true)?;
            let mut dst =
                owner
                    .regions
                    .access_dma(desc.key, desc.offset, u64::from(desc.len), true)?;
            match this.fabric.bulk_fault(data.len()) {
                None => dst.copy_in(&data)?,
                Some(BulkFault::Corrupt { at }) => {
                    let mut bad = data.to_vec();
                    bad[at] ^= 0x20;
                    dst.copy_in(&bad)?;
                }
                Some(BulkFault::BreakOff { landed }) => {
                    dst.copy_in_prefix(&data, landed)?;
                    return Err(NetError::Unreachable {
                        peer: Nid::Sim(this.owner.clone()),
                        reason: format!("bulk put broke off after {landed} bytes"),
                    });
                }
            }
            Ok(())
        })
    }

    fn get(&self, desc: &BulkDesc) -> BoxFuture<'static, Result<Vec<u8>, NetError>> {
        let this = self.clone();
        let desc = desc.clone();
        Box::pin(async move {
            let owner = this.transfer(true, u64::from(desc.len)).await?;
            this.granted(&owner, &desc, false)?;
            let mut data = owner
                .regions
                .access_dma(desc.key, desc.offset, u64::from(desc.len), false)?
                .copy_out()?;
            match this.fabric.bulk_fault(data.len()) {
                None => {}
                Some(BulkFault::Corrupt { at }) => data[at] ^= 0x20,
                Some(BulkFault::BreakOff { landed }) => {
                    return Err(NetError::Unreachable {
                        peer: Nid::Sim(this.owner.clone()),
                        reason: format!("bulk get broke off after {landed} bytes"),
                    });
                }
            }
            verify_desc_crc(&desc, &data)?;
            Ok(data)
        })
    }
}
