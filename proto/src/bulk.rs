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
