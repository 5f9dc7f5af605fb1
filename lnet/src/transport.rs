//! The caller's side of the network, the same on every backend: typed calls with a deadline,
//! and memory registration for bulk transfers.

use std::sync::Arc;
use std::time::Duration;

use proto::bulk::BulkGrant;
use proto::msg::{decode_body, encode_body};
use proto::{Nid, Opcode, RemoteError, Rpc, StatusCode};

use crate::device::DeviceMemory;
use crate::error::NetError;
use crate::region::{DmaBuffer, RegionTable, Registered};
use crate::service::BoxFuture;

/// One node's attachment to a network.
pub trait Transport: Send + Sync + 'static {
    /// This node's NID.
    fn nid(&self) -> Nid;

    /// The memory this node exposes to its peers.
    fn regions(&self) -> &Arc<RegionTable>;

    /// Sends one request and waits for its reply, for at most `deadline`. The reply body is
    /// returned as sent; an error reply becomes [`NetError::Remote`] or [`NetError::Busy`].
    /// While the call is in flight the server may move bytes with the memory `bulk` names,
    /// and no other.
    fn call_raw<'a>(
        &'a self,
        peer: &'a Nid,
        opcode: Opcode,
        body: Vec<u8>,
        bulk: Option<BulkGrant>,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, NetError>>;

    /// This node's addresses after the first, where it is reached too (multi-rail). A server
    /// tells its peers, and they spread their calls over every address that answers.
    fn rails(&self) -> Vec<Nid> {
        vec![]
    }

    /// Tells this node that `peer` is reached at `rails` too: calls to `peer` go over any of
    /// its addresses that answers. An empty list forgets them. Networks without addresses of
    /// their own (the simulated fabric) ignore it.
    fn set_peer_rails(&self, peer: &Nid, rails: &[Nid]) {
        let _ = (peer, rails);
    }

    /// Whether every connection of this node authenticates each bulk payload with a tag
    /// checked on the bytes where they land (authentication on: a connection that cannot seal
    /// is refused): a crc32c of a payload then checks nothing the tag does not.
    fn seals_payloads(&self) -> bool {
        false
    }

    /// Registers `buf` so that peers can move bulk data in and out of it.
    fn register<B: DmaBuffer>(&self, buf: B) -> Result<Registered<B>, NetError>
    where
        Self: Sized,
    {
        Ok(self.regions().register(buf)?)
    }

    /// Registers device memory so that peers' bulk transfers land in it (and leave from it)
    /// with no host copy, as an RDMA NIC does with GPU memory registered through dma-buf.
    /// Transports that cannot reach device memory refuse it; the caller stages instead.
    fn register_device(&self, mem: DeviceMemory) -> Result<Registered<DeviceMemory>, NetError> {
        let _ = mem;
        Err(NetError::NoDeviceMemory(
            "this transport moves bytes through the CPU".into(),
        ))
    }
}

/// Sends `req` to `peer` and decodes its reply.
pub async fn call<R: Rpc, T: Transport + ?Sized>(
    t: &T,
    peer: &Nid,
    req: &R,
    deadline: Duration,
) -> Result<R::Reply, NetError> {
    let body = encode_body(req).map_err(|err| NetError::Frame {
        peer: peer.clone(),
        err,
    })?;
    let reply = t
        .call_raw(peer, R::OPCODE, body, req.bulk(), deadline)
        .await?;
    decode_body(&reply).map_err(|err| NetError::Frame {
        peer: peer.clone(),
        err,
    })
}

/// Refuses a request body no receiver would accept, before it is sent.
pub(crate) fn check_body(peer: &Nid, body: &[u8]) -> Result<(), NetError> {
    if body.len() > proto::MAX_BODY as usize {
        return Err(NetError::Frame {
            peer: peer.clone(),
            err: proto::FrameError::BodyTooLarge {
                len: u32::try_from(body.len()).unwrap_or(u32::MAX),
            },
        });
    }
    Ok(())
}

/// Turns a reply frame's body into the call's result.
pub(crate) fn reply_result(peer: &Nid, error: bool, body: Vec<u8>) -> Result<Vec<u8>, NetError> {
    if !error {
        return Ok(body);
    }
    let err: RemoteError = decode_body(&body).map_err(|err| NetError::Frame {
        peer: peer.clone(),
        err,
    })?;
    Err(match err.code {
        StatusCode::Busy => NetError::Busy { peer: peer.clone() },
        _ => NetError::Remote {
            peer: peer.clone(),
            err,
        },
    })
}

/// The body of an error reply. Encoding plain data cannot fail; an empty body would be
/// reported by the caller as an undecodable reply rather than lost.
pub(crate) fn error_body(err: &RemoteError) -> Vec<u8> {
    encode_body(err).unwrap_or_default()
}
