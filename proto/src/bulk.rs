//! The bulk descriptor: how a buffer's owner tells a server where the bytes of an operation
//! live, in the RDMA style of Lustre. The owner registers memory and sends this; the server
//! moves the bytes (it puts into the region for a read and gets from it for a write).

use serde::{Deserialize, Serialize};

/// A range of a region registered on the node that sent the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkDesc {
    /// The region's remote key, as returned when it was registered.
    pub key: u64,
    /// Offset of the range within the region.
    pub offset: u64,
    /// Length of the range, at most [`crate::MAX_BULK`].
    pub len: u32,
    /// The crc32c of the range, when the owner already holds the data (a write). The server
    /// verifies it before it uses a single byte.
    pub crc32c: Option<u32>,
}

impl BulkDesc {
    /// The end of the range, or `None` if it overflows.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.len))
    }
}

/// What one call lets its server do with the caller's memory: one range of one region, in one
/// direction, for as long as the call is in flight. The caller's side refuses any other
/// transfer, so a server reaches no buffer but the one its request named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BulkGrant {
    pub key: u64,
    pub offset: u64,
    pub len: u32,
    /// The server writes into the range (a read's data); otherwise it reads from it.
    pub server_writes: bool,
}

impl BulkGrant {
    /// The grant of a descriptor sent in a request.
    pub fn of(desc: &BulkDesc, server_writes: bool) -> BulkGrant {
        BulkGrant {
            key: desc.key,
            offset: desc.offset,
            len: desc.len,
            server_writes,
        }
    }

    /// Whether a transfer of `len` bytes at `offset` of region `key`, writing or reading the
    /// owner's memory, stays inside the grant.
    pub fn covers(&self, key: u64, offset: u64, len: u64, write: bool) -> bool {
        let end = offset.checked_add(len);
        let grant_end = self.offset + u64::from(self.len);
        key == self.key
            && write == self.server_writes
            && offset >= self.offset
            && end.is_some_and(|e| e <= grant_end)
    }
}

/// Body of a `BulkGet` frame: the range the server pulls, for the request `call` (the xid of
/// the request being served; the frame's own xid tags the transfer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkGetHead {
    pub call: u64,
    pub desc: BulkDesc,
}

/// Body of a `BulkPut` frame: where in the owner's region the payload that follows goes.
/// The frame's xid is the xid of the request being served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkPutHead {
    pub key: u64,
    pub offset: u64,
    /// crc32c of the payload, checked by the owner once the bytes have landed.
    pub crc32c: u32,
}

/// Body of a `BulkData` frame: the outcome of the `BulkGet` with the same xid, followed on
/// success by the payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkDataHead {
    /// The payload's crc32c, or why the owner refused the range.
    pub result: Result<u32, crate::RemoteError>,
}
